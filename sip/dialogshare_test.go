package sip

import (
	"sync"
	"testing"

	gosip "github.com/emiago/sipgo/sip"

	"github.com/sluicelb/sluice/lb"
)

// TestDialogSharedAcrossNodes: node A forwards an INVITE that fails over
// from b1 (503) to b2; a client that ignores Record-Route sends its ACK
// and BYE to node B, whose Call-ID hash picks b1. With A's dialog table
// changes applied on B, they reach b2; without them B would send them to b1.
func TestDialogSharedAcrossNodes(t *testing.T) {
	b1, b2 := newUAS(t, "b1"), newUAS(t, "b2")
	b1.mode.Store(mode503)
	a := testServer(t, []*uas{b1, b2}, nil, nil)
	b := testServer(t, []*uas{b1, b2}, nil, nil)
	var mu sync.Mutex
	var ops []DialogOp
	a.SetDialogShare(func(ev DialogEvent) {
		mu.Lock()
		ops = append(ops, ev.Op)
		mu.Unlock()
		b.ApplyDialog(ev) // in a cluster: through Redis to every other node
	})
	hashB1 := b.pool.Load().list[0]
	ca, cb := newUAC(t, a.udpAddr()), newUAC(t, b.udpAddr())
	var k *call
	for k = ca.newCall(); b.pool.Load().home(lb.Hash(k.callID), b.clock.Now()) != hashB1; k = ca.newCall() {
	}
	k.invite("")
	ca.recvResponse(180)
	k.learn(ca.recvResponse(200))
	k.tokenless(b.udpAddr().String())
	k.c = cb // the in-dialog requests go to node B
	k.inDialog("ACK", 1, k.branch+"-ack")
	k.inDialog("BYE", 2, k.branch+"-bye")
	cb.recvResponse(200)
	eventually(t, "ACK at b2", func() bool { return b2.count(gosip.ACK, k.callID) == 1 })
	if n := b2.count(gosip.BYE, k.callID); n != 1 {
		t.Errorf("%d BYEs at b2 through node B, want 1", n)
	}
	if n := b1.count(gosip.BYE, k.callID); n != 0 {
		t.Errorf("%d BYEs at b1 (node B's Call-ID hash choice), want 0", n)
	}
	if r := b.metrics.DialogMisses.Load(); r != 0 {
		t.Errorf("node B missed the dialog %d times", r)
	}
	mu.Lock()
	defer mu.Unlock()
	// b1's 503 moved the entry (insert for b1, insert for b2), then the 2xx.
	want := []DialogOp{DialogInsert, DialogInsert, DialogConfirm}
	if len(ops) < len(want) {
		t.Fatalf("shared ops %v, want at least %v", ops, want)
	}
	for i, op := range want {
		if ops[i] != op {
			t.Errorf("shared ops %v, want %v first", ops, want)
			break
		}
	}
}
