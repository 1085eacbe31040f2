package cluster

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicelb/sluice/admission"
	"github.com/sluicelb/sluice/lb"
)

// testRing is an affinity key ring of two keys: 1 (older) and 2 (newest).
var testRing = []lb.Key{{ID: 1, Secret: bytes.Repeat([]byte{1}, 32)}, {ID: 2, Secret: bytes.Repeat([]byte{2}, 32)}}

// TestShareDialogs: a change published on one node is applied on the
// others and not echoed back to its own.
func TestShareDialogs(t *testing.T) {
	mr, _ := newMini(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type got struct {
		mu   sync.Mutex
		msgs []string
	}
	var nodes []*Cluster
	var gots []*got
	var pubs []func([]byte)
	for _, name := range []string{"a", "b", "c"} {
		rdb, err := NewClient("redis://"+mr.Addr(), time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer rdb.Close()
		c, err := New(Config{Redis: "x", Name: "t", Node: name}, rdb, admission.MonoClock{}, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		c.heartbeat(ctx, false)
		g := &got{}
		pub, err := c.ShareDialogs(ctx, testRing, func(b []byte) error { g.mu.Lock(); g.msgs = append(g.msgs, string(b)); g.mu.Unlock(); return nil })
		if err != nil {
			t.Fatal(err)
		}
		pubs = append(pubs, pub)
		nodes = append(nodes, c)
		gots = append(gots, g)
	}
	// Subscriptions are asynchronous: publish until b and c have one.
	deadline := time.Now().Add(5 * time.Second)
	for {
		pubs[0]([]byte(`{"op":1,"call_id":"x"}`))
		time.Sleep(20 * time.Millisecond)
		gots[1].mu.Lock()
		gots[2].mu.Lock()
		n1, n2 := len(gots[1].msgs), len(gots[2].msgs)
		gots[2].mu.Unlock()
		gots[1].mu.Unlock()
		if n1 > 0 && n2 > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("b got %d and c got %d changes within 5s", n1, n2)
		}
	}
	gots[0].mu.Lock()
	defer gots[0].mu.Unlock()
	if len(gots[0].msgs) != 0 {
		t.Errorf("the publishing node applied its own change: %v", gots[0].msgs)
	}
	if gots[1].msgs[0] != `{"op":1,"call_id":"x"}` {
		t.Errorf("b got %q", gots[1].msgs[0])
	}
	// The publisher counts a batch once Redis has answered, which can be
	// after a subscriber got it.
	for deadline := time.Now().Add(5 * time.Second); nodes[0].Dialogs().Published == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("a's counters %+v", nodes[0].Dialogs())
		}
	}
}

// TestDialogMessagesHostile is the golden table of messages on the dialog
// channel, which any Redis client can publish to: only a change signed
// with a key of the ring, for this cluster, from another node, not seen
// before and within a minute of this node's clock is applied. Before the
// fix every message "NODE\nJSON" was applied: any Redis client injected
// 300,000 dialogs into every node (19 MB each, kept an hour) and could
// redirect other nodes' token-less in-dialog requests.
func TestDialogMessagesHostile(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	const ch = "{sluice:t}:dialogs"
	ring, err := newDialogSigner(ch, testRing)
	if err != nil {
		t.Fatal(err)
	}
	old, _ := newDialogSigner(ch, testRing[:1])                                             // a node still sealing with key 1
	other, _ := newDialogSigner(ch, []lb.Key{{ID: 2, Secret: bytes.Repeat([]byte{9}, 32)}}) // id 2, another secret
	elsewhere, _ := newDialogSigner("{sluice:u}:dialogs", testRing)                         // another cluster, same key
	fresh := func() *dialogSigner { s, _ := newDialogSigner(ch, testRing); return s }       // another node's: its own sequence
	ev := `{"op":1,"call_id":"c1","from_tag":"f","backend":"10.0.0.9:5060"}`
	good := ring.sign("b", []byte(ev), now)
	head, rest, _ := strings.Cut(good, "\n")
	node, rest, _ := strings.Cut(rest, "\n")
	seq, _, _ := strings.Cut(rest, "\n")
	for _, tc := range []struct {
		name, msg string
		at        time.Duration // the receiver's clock, after now
		want      int
	}{
		{"signed with the newest key", good, 0, openOK},
		{"replayed", good, time.Second, openInvalid},
		{"signed with the older key of the ring", old.sign("b", []byte(ev), now.Add(time.Millisecond)), 0, openOK},
		{"this node's own", ring.sign("a", []byte(ev), now), 0, openOwn},
		{"unsigned, as before the fix", "b\n" + ev, 0, openBadSig},
		{"unsigned, empty", "", 0, openBadSig},
		{"a key id not in the ring", strings.Replace(good, "s1 2 ", "s1 7 ", 1), 0, openBadSig},
		{"a key id out of range", strings.Replace(good, "s1 2 ", "s1 256 ", 1), 0, openBadSig},
		{"another secret under the same id", other.sign("b", []byte(ev), now.Add(2*time.Millisecond)), 0, openBadSig},
		{"another cluster's channel", elsewhere.sign("b", []byte(ev), now.Add(3*time.Millisecond)), 0, openBadSig},
		{"payload altered", strings.Replace(good, "10.0.0.9", "10.6.6.6", 1), 0, openBadSig},
		{"node altered", head + "\nc\n" + seq + "\n" + ev, 0, openBadSig},
		{"sequence altered", head + "\n" + node + "\n" + seq + "1\n" + ev, 0, openBadSig},
		{"signature not hex", "s1 2 zz\nb\n1\n" + ev, 0, openBadSig},
		{"signature short", "s1 2 abcd\nb\n1\n" + ev, 0, openBadSig},
		{"no header line", "s1 2 " + strings.Repeat("0", 64), 0, openBadSig},
		{"too big", ring.sign("b", []byte(`{"op":1,"call_id":"`+strings.Repeat("x", maxDialogMessage)+`"}`), now.Add(4*time.Millisecond)), 0, openInvalid},
		{"stale: two minutes old", fresh().sign("s", []byte(ev), now.Add(-2*time.Minute)), 0, openInvalid},
		{"from two minutes ahead", fresh().sign("e", []byte(ev), now.Add(2*time.Minute)), 0, openInvalid},
		{"fresh, later", fresh().sign("b", []byte(ev), now.Add(30*time.Second)), 30 * time.Second, openOK},
	} {
		_, payload, got := ring.open(tc.msg, "a", now.Add(tc.at))
		if got != tc.want {
			t.Errorf("%s: outcome %d, want %d", tc.name, got, tc.want)
		}
		if got == openOK && payload != ev && !strings.Contains(tc.name, "too big") {
			t.Errorf("%s: payload %q", tc.name, payload)
		}
	}
}

// TestDialogChannelForged: forged and unsigned messages published straight
// to the channel are not applied and are counted; a signed change that
// follows them is applied; an insert past the cap is counted as capped.
func TestDialogChannelForged(t *testing.T) {
	mr, rdb := newMini(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	mk := func(name string) *Cluster {
		r, err := NewClient("redis://"+mr.Addr(), time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Close() })
		c, err := New(Config{Redis: "x", Name: "t", Node: name}, r, admission.MonoClock{}, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		c.heartbeat(ctx, false)
		return c
	}
	a, b := mk("a"), mk("b")
	var mu sync.Mutex
	var got []string
	full := false
	pubA, err := a.ShareDialogs(ctx, testRing, func([]byte) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.ShareDialogs(ctx, testRing, func(p []byte) error {
		mu.Lock()
		defer mu.Unlock()
		if full {
			return ErrDialogCap
		}
		got = append(got, string(p))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.ShareDialogs(ctx, nil, nil); err == nil {
		t.Error("ShareDialogs without keys: no error")
	}
	forged := []string{"a\n{\"op\":1,\"call_id\":\"x\",\"backend\":\"evil\"}", "s1 2 00\na\n1\n{}", strings.Repeat("x", 10000)}
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for !ok() {
			if time.Now().After(deadline) {
				t.Fatalf("no %s within 5s", what)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	// Subscriptions are asynchronous: publish signed changes until b has one.
	waitFor("first change at b", func() bool {
		pubA([]byte(`{"op":1,"call_id":"warm-up"}`))
		time.Sleep(10 * time.Millisecond)
		mu.Lock()
		defer mu.Unlock()
		return len(got) > 0
	})
	mu.Lock()
	got = nil
	mu.Unlock()
	for _, f := range forged {
		if err := rdb.Publish(ctx, "{sluice:t}:dialogs", f).Err(); err != nil {
			t.Fatal(err)
		}
	}
	pubA([]byte(`{"op":1,"call_id":"real"}`))
	waitFor("the signed change after the forged ones", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) > 0 && got[len(got)-1] == `{"op":1,"call_id":"real"}`
	})
	mu.Lock()
	for _, g := range got {
		if strings.Contains(g, "evil") || g == "{}" {
			t.Errorf("forged change applied: %q", g)
		}
	}
	full = true
	mu.Unlock()
	if st := b.Dialogs(); st.Rejected != uint64(len(forged)) {
		t.Errorf("b rejected %d changes, want the %d forged: %+v", st.Rejected, len(forged), st)
	}
	if r := b.Rejected(); r["dialog_signature"] != 2 || r["dialog_invalid"] != 1 {
		t.Errorf("b's rejections by kind %v", r)
	}
	pubA([]byte(`{"op":1,"call_id":"over the cap"}`))
	waitFor("a capped change", func() bool { return b.Dialogs().Capped == 1 })
}
