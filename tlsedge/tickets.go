package tlsedge

import (
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// TicketKeySource supplies the secrets session ticket keys are derived
// from. Every node of a cluster must return the same secrets (a node
// derives them from the cluster's shared key ring) so that a client
// resumes its session on any node.
type TicketKeySource interface {
	// TicketSecrets returns the secrets, newest first, each at least 16
	// bytes: keys of the first seal new tickets, keys of every one open
	// them. It is called once an hour, when the keys rotate.
	TicketSecrets() ([][]byte, error)
}

// StaticSecrets is a TicketKeySource of fixed secrets, newest first.
type StaticSecrets [][]byte

// TicketSecrets returns s.
func (s StaticSecrets) TicketSecrets() ([][]byte, error) { return s, nil }

// RandomSecret returns a StaticSecrets of one random 32-byte secret: the
// tickets of a process that no other process opens.
func RandomSecret() StaticSecrets {
	b := make([]byte, 32)
	rand.Read(b) // never fails (crypto/rand)
	return StaticSecrets{b}
}

// Ticket key scheme: the hour is the Unix time in whole hours, the same
// on every node whose clock is right. Each hour has its key, HKDF-SHA256
// of a secret with ticketKeyLabel and the hour number; new tickets are
// sealed with the newest secret's key of the current hour, and the keys of
// the two hours before (tickets up to two to three hours old) and of the
// next hour (a node whose clock runs a little behind the sealing node's)
// open them.
const (
	ticketKeyLabel = "sluice tls session ticket v1 hour "
	// maxTicketSecrets bounds the secrets whose keys open tickets.
	maxTicketSecrets = 4
	ticketKeyHour    = int64(time.Hour / time.Second)
)

// ticketKeys returns the session ticket keys of hour for secrets, the
// sealing key first (see ticketKeyLabel). Secrets shorter than 16 bytes
// are skipped.
func ticketKeys(secrets [][]byte, hour int64) [][32]byte {
	var out [][32]byte
	used := 0
	for _, sec := range secrets {
		if len(sec) < 16 {
			continue
		}
		if used++; used > maxTicketSecrets {
			break
		}
		for _, h := range []int64{hour, hour - 1, hour - 2, hour + 1} {
			k, err := hkdf.Key(sha256.New, sec, nil, ticketKeyLabel+strconv.FormatInt(h, 10), 32)
			if err != nil {
				continue // cannot happen: 32 bytes of SHA-256
			}
			out = append(out, [32]byte(k))
		}
	}
	return out
}

// ticketKeySet seals and opens session tickets with the keys of the
// current hour. The keys live in a tls.Config of their own (whose
// EncryptTicket and DecryptTicket do the work), swapped whole when the
// hour changes: the first handshake of a new hour derives them, the others
// read an atomic pointer. The configs a Store hands out call it through
// WrapSession and UnwrapSession, so their clones rotate too.
type ticketKeySet struct {
	src TicketKeySource
	now func() time.Time

	cur atomic.Pointer[ticketKeysOfHour]
	mu  sync.Mutex // one derivation at a time
	// secrets are the last the source gave; a failing source keeps them.
	secrets [][]byte
}

type ticketKeysOfHour struct {
	hour int64
	keys [][32]byte
	cfg  *tls.Config
}

func newTicketKeySet(src TicketKeySource, now func() time.Time) *ticketKeySet {
	if src == nil {
		src = RandomSecret()
	}
	return &ticketKeySet{src: src, now: now}
}

// hourOf is t's Unix hour.
func hourOf(t time.Time) int64 {
	u := t.Unix()
	h := u / ticketKeyHour
	if u < 0 && u%ticketKeyHour != 0 {
		h--
	}
	return h
}

// current returns the keys of the present hour.
func (t *ticketKeySet) current() *ticketKeysOfHour {
	h := hourOf(t.now())
	if k := t.cur.Load(); k != nil && k.hour == h {
		return k
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if k := t.cur.Load(); k != nil && k.hour == h {
		return k
	}
	if s, err := t.src.TicketSecrets(); err == nil && len(s) > 0 {
		t.secrets = s
	}
	keys := ticketKeys(t.secrets, h)
	if len(keys) == 0 {
		// No usable secret: tickets of this process only, rather than none.
		t.secrets = RandomSecret()
		keys = ticketKeys(t.secrets, h)
	}
	cfg := &tls.Config{}
	cfg.SetSessionTicketKeys(keys)
	k := &ticketKeysOfHour{hour: h, keys: keys, cfg: cfg}
	t.cur.Store(k)
	return k
}

// wrap is a tls.Config.WrapSession: the ticket sealed with the current
// hour's key.
func (t *ticketKeySet) wrap(cs tls.ConnectionState, ss *tls.SessionState) ([]byte, error) {
	return t.current().cfg.EncryptTicket(cs, ss)
}

// unwrap is a tls.Config.UnwrapSession: a ticket sealed by any key of the
// hours kept; (nil, nil) for any other, which is a full handshake.
func (t *ticketKeySet) unwrap(identity []byte, cs tls.ConnectionState) (*tls.SessionState, error) {
	return t.current().cfg.DecryptTicket(identity, cs)
}
