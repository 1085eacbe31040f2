package cluster

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicelb/sluice/lb"
)

// dialogQueue bounds the dialog changes waiting to be published; past it
// they are dropped (counted): a dropped change only costs a token-less
// in-dialog request on another node the Call-ID hash's choice.
const dialogQueue = 4096

// DialogKeyLabel is the use the affinity key ring's keys are derived for
// (lb.DeriveKeys) to sign dialog changes.
const DialogKeyLabel = "sluice cluster dialog events v1"

// maxDialogMessage bounds a dialog change as published (signature, node,
// sequence and the encoded change): a SIP message's Call-ID and tags fit
// with room to spare. Larger messages are refused before any other work.
const maxDialogMessage = 4096

// dialogMaxSkew is how far a change's sequence number, a wall clock time
// of its node, may be from this node's wall clock: a change recorded on
// Redis (or captured) cannot be replayed later than that, and a node
// whose clock is further off than that shares no dialogs (counted).
const dialogMaxSkew = time.Minute

// dialogSigPrefix starts every signed change (format version 1).
const dialogSigPrefix = "s1 "

// maxDialogSenders bounds the per-node sequence numbers remembered.
const maxDialogSenders = 4096

// Errors the apply function given to ShareDialogs returns.
var (
	// ErrDialogCap: the change would add a dialog while this node's table
	// already holds Config.DialogMax entries or more.
	ErrDialogCap = errors.New("cluster: dialog table holds the most dialogs other nodes may add")
	// ErrDialogInvalid: the change is signed but cannot be decoded.
	ErrDialogInvalid = errors.New("cluster: dialog change unreadable")
)

// DialogStats counts the dialog table changes shared with other nodes.
type DialogStats struct {
	Published uint64 `json:"published"`
	Applied   uint64 `json:"applied"`
	Dropped   uint64 `json:"dropped"` // queue full or Redis away
	// Rejected changes read from Redis: unsigned, a bad signature or an
	// unknown key, too big, replayed or stale, unreadable.
	Rejected uint64 `json:"rejected"`
	// Capped: inserts not applied because the table held DialogMax
	// entries or more.
	Capped uint64 `json:"capped"`
}

type dialogBus struct {
	published, applied, dropped, rejected, capped atomic.Uint64
}

// dialogSigner signs and checks dialog changes with keys derived from the
// affinity key ring: it signs with the newest and accepts every key of
// the ring, so a key rotation (add a key everywhere, then make it the
// newest) never stops the sharing.
type dialogSigner struct {
	channel string
	newest  lb.Key
	keys    [256][]byte // by key id; nil: not in the ring

	mu   sync.Mutex
	last map[string]int64 // node → highest sequence number accepted
	seq  int64            // this node's last sequence number
}

func newDialogSigner(channel string, ring []lb.Key) (*dialogSigner, error) {
	if len(ring) == 0 {
		return nil, fmt.Errorf("%w: dialog sharing needs the affinity key ring (no keys)", ErrConfig)
	}
	keys, err := lb.DeriveKeys(ring, DialogKeyLabel)
	if err != nil {
		return nil, fmt.Errorf("%w: dialog sharing: %w", ErrConfig, err)
	}
	s := &dialogSigner{channel: channel, newest: keys[len(keys)-1], last: map[string]int64{}}
	for _, k := range keys {
		s.keys[k.ID] = k.Secret
	}
	return s, nil
}

// mac is the signature of a change: HMAC-SHA256 over the channel (so a
// change of one cluster is void in another sharing the key), the node,
// the sequence number and the change.
func (s *dialogSigner) mac(key []byte, node, seq, payload string) []byte {
	h := hmac.New(sha256.New, key)
	h.Write([]byte(s.channel))
	h.Write([]byte{'\n'})
	h.Write([]byte(node))
	h.Write([]byte{'\n'})
	h.Write([]byte(seq))
	h.Write([]byte{'\n'})
	h.Write([]byte(payload))
	return h.Sum(nil)
}

// sign returns the message published for payload from node at wall time
// now: "s1 KEYID HEXMAC\nNODE\nSEQ\nPAYLOAD". SEQ is the wall time in ns,
// kept increasing.
func (s *dialogSigner) sign(node string, payload []byte, now time.Time) string {
	s.mu.Lock()
	s.seq = max(s.seq+1, now.UnixNano())
	seq := strconv.FormatInt(s.seq, 10)
	s.mu.Unlock()
	p := string(payload)
	return dialogSigPrefix + strconv.Itoa(int(s.newest.ID)) + " " + hex.EncodeToString(s.mac(s.newest.Secret, node, seq, p)) +
		"\n" + node + "\n" + seq + "\n" + p
}

// Outcomes of dialogSigner.open.
const (
	openOK = iota
	openOwn
	openBadSig  // unsigned, unknown key, bad signature
	openInvalid // too big, replayed, stale
)

// open checks msg and returns its node and payload. self's own changes
// come back as openOwn.
func (s *dialogSigner) open(msg, self string, now time.Time) (node, payload string, outcome int) {
	if len(msg) > maxDialogMessage {
		return "", "", openInvalid
	}
	head, rest, ok := strings.Cut(msg, "\n")
	if !ok || !strings.HasPrefix(head, dialogSigPrefix) {
		return "", "", openBadSig
	}
	id, sig, ok := strings.Cut(head[len(dialogSigPrefix):], " ")
	n, err := strconv.ParseUint(id, 10, 8)
	if !ok || err != nil || s.keys[n] == nil {
		return "", "", openBadSig
	}
	got, err := hex.DecodeString(sig)
	if err != nil || len(got) != sha256.Size {
		return "", "", openBadSig
	}
	node, rest, ok1 := strings.Cut(rest, "\n")
	seq, payload, ok2 := strings.Cut(rest, "\n")
	if !ok1 || !ok2 || !hmac.Equal(got, s.mac(s.keys[n], node, seq, payload)) {
		return "", "", openBadSig
	}
	if node == self {
		return node, payload, openOwn
	}
	t, err := strconv.ParseInt(seq, 10, 64)
	if err != nil {
		return "", "", openInvalid
	}
	if d := now.UnixNano() - t; d > int64(dialogMaxSkew) || d < -int64(dialogMaxSkew) {
		return "", "", openInvalid // stale (replayed later) or a clock far off
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if t <= s.last[node] {
		return "", "", openInvalid // replayed
	}
	if len(s.last) >= maxDialogSenders {
		clear(s.last) // the skew check still bounds replays
	}
	s.last[node] = t
	return node, payload, openOK
}

// ShareDialogs replicates the SIP dialog table between nodes by Redis
// publish/subscribe on the channel {sluice:NAME}:dialogs. Every change is
// signed with a key derived from ring, the affinity key ring every node
// shares (HMAC-SHA256; the newest key signs, every key of the ring is
// accepted), and carries its node's increasing sequence number; changes
// that are unsigned, signed with a key not in ring, altered, larger than
// 4 KB, replayed or more than a minute off this node's clock are dropped
// and counted (DialogStats.Rejected), as are changes that apply refuses
// (ErrDialogCap: DialogStats.Capped). publish (to be called on the message
// path) queues an encoded change without blocking; apply is called with
// every other node's changes. Lookups never touch Redis; changes made while
// Redis is away are not replayed. Both goroutines end with ctx.
func (c *Cluster) ShareDialogs(ctx context.Context, ring []lb.Key, apply func([]byte) error) (publish func([]byte), err error) {
	channel := c.prefix + ":dialogs"
	signer, err := newDialogSigner(channel, ring)
	if err != nil {
		return nil, err
	}
	q := make(chan []byte, dialogQueue)
	self := c.cfg.Node
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case msg := <-q:
				if !c.Up() {
					c.dialogs.dropped.Add(1)
					continue
				}
				pctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
				// Send what has queued up meanwhile in one pipeline.
				pipe := c.rdb.Pipeline()
				n := 1
				pipe.Publish(pctx, channel, signer.sign(self, msg, time.Now()))
			more:
				for n < 256 {
					select {
					case m := <-q:
						pipe.Publish(pctx, channel, signer.sign(self, m, time.Now()))
						n++
					default:
						break more
					}
				}
				_, err := pipe.Exec(pctx)
				cancel()
				c.roundTrips.Add(1)
				if err != nil {
					c.dialogs.dropped.Add(uint64(n))
					continue
				}
				c.dialogs.published.Add(uint64(n))
			}
		}
	}()
	sub := c.rdb.Subscribe(ctx, channel) // go-redis resubscribes after a reconnect
	go func() {
		<-ctx.Done()
		sub.Close() // ends the channel below
	}()
	go func() {
		for m := range sub.Channel() {
			c.applyDialog(signer, m.Payload, apply)
		}
	}()
	return func(msg []byte) {
		select {
		case q <- msg:
		default:
			c.dialogs.dropped.Add(1)
		}
	}, nil
}

// applyDialog checks one message of the dialog channel and applies it.
func (c *Cluster) applyDialog(signer *dialogSigner, msg string, apply func([]byte) error) {
	node, payload, outcome := signer.open(msg, c.cfg.Node, time.Now())
	switch outcome {
	case openOwn:
		return
	case openBadSig:
		c.dialogs.rejected.Add(1)
		c.rejectf(rejectDialogSig, 1, "dialog change unsigned or with a bad signature, dropped (do all nodes run this version with the same -affinity-key-file?)", "bytes", len(msg))
		return
	case openInvalid:
		c.dialogs.rejected.Add(1)
		c.rejectf(rejectDialogBad, 1, "dialog change too big, replayed or too far off this node's clock, dropped", "bytes", len(msg))
		return
	}
	switch err := apply([]byte(payload)); {
	case err == nil:
		c.dialogs.applied.Add(1)
	case errors.Is(err, ErrDialogCap):
		c.dialogs.capped.Add(1)
		c.rejectf(rejectDialogCap, 1, "dialog table holds the most dialogs other nodes may add (-cluster-dialog-max); change not applied", "node", node, "max", c.cfg.DialogMax)
	default:
		c.dialogs.rejected.Add(1)
		c.rejectf(rejectDialogBad, 1, "signed dialog change unreadable, dropped", "node", node, "err", err)
	}
}

// DialogMax is the most dialog table entries other nodes' changes may fill
// (Config.DialogMax).
func (c *Cluster) DialogMax() int { return c.cfg.DialogMax }

// Dialogs returns the dialog sharing counters.
func (c *Cluster) Dialogs() DialogStats {
	return DialogStats{Published: c.dialogs.published.Load(), Applied: c.dialogs.applied.Load(), Dropped: c.dialogs.dropped.Load(),
		Rejected: c.dialogs.rejected.Load(), Capped: c.dialogs.capped.Load()}
}
