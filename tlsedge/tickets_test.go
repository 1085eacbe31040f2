package tlsedge

import (
	"bytes"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"testing"
	"time"
)

// TestTicketKeysGolden pins the derivation: every node, whatever its
// version, must compute the same keys from the same secret and hour.
func TestTicketKeysGolden(t *testing.T) {
	secret := bytes.Repeat([]byte{0x42}, 32)
	keys := ticketKeys([][]byte{secret}, 493000)
	if len(keys) != 4 {
		t.Fatalf("%d keys; want the hour, two before, one after", len(keys))
	}
	for i, h := range []int64{493000, 492999, 492998, 493001} {
		if one := ticketKeys([][]byte{secret}, h); one[0] != keys[i] {
			t.Errorf("key %d is not hour %d's", i, h)
		}
	}
	// HKDF-SHA256(ikm 32×0x42, no salt, info "sluice tls session ticket v1
	// hour 493000"), computed apart with Python's hmac.
	const golden = "c29ee58507fa3984660fbea85ffad257f9ebf9ba2a28d7553de04dee942ec799"
	if got := hex.EncodeToString(keys[0][:]); got != golden {
		t.Errorf("hour key %s; want %s", got, golden)
	}
	// Short secrets are skipped, at most maxTicketSecrets are used.
	many := [][]byte{[]byte("short")}
	for i := range 6 {
		many = append(many, bytes.Repeat([]byte{byte(i)}, 16))
	}
	if got := ticketKeys(many, 1); len(got) != 4*maxTicketSecrets {
		t.Errorf("%d keys from 6 good secrets; want %d", len(got), 4*maxTicketSecrets)
	}
	if got := ticketKeys(nil, 1); len(got) != 0 {
		t.Errorf("keys without a secret: %d", len(got))
	}
}

func TestHourOf(t *testing.T) {
	for _, tc := range []struct {
		unix int64
		want int64
	}{{0, 0}, {3599, 0}, {3600, 1}, {-1, -1}, {-3600, -1}, {-3601, -2}} {
		if got := hourOf(time.Unix(tc.unix, 0)); got != tc.want {
			t.Errorf("hourOf(%d) = %d; want %d", tc.unix, got, tc.want)
		}
	}
}

// ticketStore is a store whose tickets derive from secret, on clock.
func ticketStore(t *testing.T, file string, secret []byte, clock *wallClock) *Store {
	t.Helper()
	s, err := New(Config{Certs: []string{file}, HandshakeTimeout: time.Second}, Deps{Tickets: StaticSecrets{secret}, Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestTicketsSharedAcrossStores: two stores (two nodes) with the same
// cluster secret in the same hour have the same keys, and a client's
// session from one resumes on the other, in TLS 1.2 and 1.3; another
// secret, or a ticket older than the hours kept, makes a full handshake.
func TestTicketsSharedAcrossStores(t *testing.T) {
	dir := t.TempDir()
	file := combined(t, dir, "site.pem", certOpts{dns: []string{"www.example.com"}})
	secret := bytes.Repeat([]byte{7}, 32)
	clockA, clockB := newWallClock(), newWallClock()
	a := ticketStore(t, file, secret, clockA)
	b := ticketStore(t, file, secret, clockB)
	other := ticketStore(t, file, bytes.Repeat([]byte{8}, 32), clockB)
	if ka, kb := a.tickets.current().keys, b.tickets.current().keys; len(ka) != 4 || !equalKeys(ka, kb) {
		t.Fatal("two stores with the same secret and hour derive different keys")
	}
	if equalKeys(a.tickets.current().keys, other.tickets.current().keys) {
		t.Fatal("another secret derives the same keys")
	}
	for _, version := range []uint16{tls.VersionTLS12, tls.VersionTLS13} {
		for _, tc := range []struct {
			name     string
			resumeOn *Store
			later    time.Duration // how much later the resuming node's clock is
			resumed  bool
		}{
			{"same node", a, 0, true},
			{"other node", b, 0, true},
			{"other node two hours on", b, 2 * time.Hour, true},
			{"other node an hour behind", b, -time.Hour, true},
			{"other node four hours on", b, 4 * time.Hour, false},
			{"other cluster", other, 0, false},
		} {
			clockB.Set(clockA.Now().Add(tc.later))
			cli := clientFor("www.example.com")
			cli.MinVersion, cli.MaxVersion = version, version
			cli.ClientSessionCache = tls.NewLRUClientSessionCache(4)
			cs, err := handshake(t, a.ServerConfig(), cli)
			if err != nil || cs.DidResume {
				t.Fatalf("%x %s: first handshake: %v resumed %v", version, tc.name, err, cs.DidResume)
			}
			cs, err = handshake(t, tc.resumeOn.ServerConfig(), cli)
			if err != nil {
				t.Fatalf("%x %s: second handshake: %v", version, tc.name, err)
			}
			if cs.DidResume != tc.resumed {
				t.Errorf("TLS %x %s: resumed %v; want %v", version, tc.name, cs.DidResume, tc.resumed)
			}
		}
	}
}

func equalKeys(a, b [][32]byte) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// failingSource fails after its first answer.
type failingSource struct{ calls int }

func (f *failingSource) TicketSecrets() ([][]byte, error) {
	f.calls++
	if f.calls > 1 {
		return nil, errors.New("key ring unavailable")
	}
	return [][]byte{bytes.Repeat([]byte{9}, 32)}, nil
}

// TestTicketSourceFailure: a source that fails keeps the last secrets; a
// source with no usable secret gives tickets of this process rather than
// none.
func TestTicketSourceFailure(t *testing.T) {
	clock := newWallClock()
	src := &failingSource{}
	ks := newTicketKeySet(src, clock.Now)
	first := ks.current().keys
	clock.Add(time.Hour)
	next := ks.current().keys
	if src.calls != 2 || next[1] != first[0] {
		t.Errorf("after a failing source: calls %d, previous hour's key kept %v", src.calls, next[1] == first[0])
	}
	short := newTicketKeySet(StaticSecrets{[]byte("short")}, clock.Now)
	if k := short.current().keys; len(k) != 4 {
		t.Errorf("no usable secret: %d keys; want a random secret's 4", len(k))
	}
}
