package sip

import (
	"fmt"
	"testing"
)

// TestApplyRemoteDialogCap: other nodes' inserts stop at the cap (the
// table then holds at most max of them), while their confirms and
// removals, and this node's own inserts, still apply.
func TestApplyRemoteDialogCap(t *testing.T) {
	b1 := newUAS(t, "b1")
	s := testServer(t, []*uas{b1}, nil, func(c *Config) { c.DialogMax = 100 })
	const max = 3
	applied := 0
	for i := range 5 {
		if s.ApplyRemoteDialog(DialogEvent{Op: DialogInsert, CallID: fmt.Sprint("r", i), FromTag: "f", Backend: "b1"}, max) {
			applied++
		}
	}
	if applied != max || s.dialogs.Len() != max {
		t.Errorf("applied %d remote inserts, table holds %d; want %d and %d", applied, s.dialogs.Len(), max, max)
	}
	if !s.ApplyRemoteDialog(DialogEvent{Op: DialogConfirm, CallID: "r0", FromTag: "f", ToTag: "t"}, max) {
		t.Error("a confirm was refused at the cap")
	}
	now := s.clock.Now()
	s.insertDialog(s.dialogs.key("local", "f"), "", "b1", now) // this node's own dialog: the cap is not its
	if s.dialogs.Len() != max+1 {
		t.Errorf("a local insert at the remote cap: table holds %d, want %d", s.dialogs.Len(), max+1)
	}
	if !s.ApplyRemoteDialog(DialogEvent{Op: DialogRemove, CallID: "r1", FromTag: "f"}, max) || s.dialogs.Len() != max {
		t.Errorf("a removal at the cap: table holds %d, want %d", s.dialogs.Len(), max)
	}
	if s.ApplyRemoteDialog(DialogEvent{Op: DialogInsert, CallID: "r9", FromTag: "f", Backend: "b1"}, max) {
		t.Error("an insert while the table holds max entries (one of them local) was applied")
	}
}
