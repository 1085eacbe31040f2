package sip

import (
	gosip "github.com/emiago/sipgo/sip"

	"github.com/sluicelb/sluice/admission"
)

// DialogOp is a change of the dialog table.
type DialogOp uint8

// Dialog table changes, as shared between the nodes of a cluster.
const (
	DialogInsert  DialogOp = iota + 1 // the INVITE went to Backend
	DialogConfirm                     // its first 2xx carried ToTag
	DialogRemove                      // the INVITE failed: no dialog
	DialogEnd                         // a BYE was answered: linger, then go
)

// DialogEvent is one change of the dialog table. With a cluster, every
// node applies the others' events to its own table, so a client that
// ignores Record-Route may send its ACK or BYE to any node and still reach
// the INVITE's backend. Lookups stay local: in-dialog requests never wait
// on the network.
type DialogEvent struct {
	Op      DialogOp `json:"op"`
	CallID  string   `json:"call_id"`
	FromTag string   `json:"from_tag"`         // the caller's tag (the table key's)
	ToTag   string   `json:"to_tag,omitempty"` // DialogConfirm, DialogEnd
	Backend string   `json:"backend,omitempty"`
	// Pool is the pool of the dialog (DialogInsert); "" from a node that
	// does not send it.
	Pool string `json:"pool,omitempty"`
}

// shareDialog hands a change of the INVITE req's dialog to Deps.DialogShare.
func (s *Server) shareDialog(op DialogOp, req *gosip.Request, to, pool, backend string) {
	share := s.share.Load()
	if share == nil {
		return
	}
	var from string
	if f := header(req, "from", "f"); f != nil {
		from = tagParam(f.Value())
	}
	(*share)(DialogEvent{Op: op, CallID: req.CallID().Value(), FromTag: from, ToTag: to, Backend: backend, Pool: pool})
}

// SetDialogShare sets (or with nil, clears) the receiver of dialog table
// changes, as Deps.DialogShare does; safe while the server runs.
func (s *Server) SetDialogShare(f func(DialogEvent)) {
	if f == nil {
		s.share.Store(nil)
		return
	}
	s.share.Store(&f)
}

// ApplyDialog applies a change of the dialog table made on another node.
// An event for a backend this node does not know is kept all the same (the
// lookup then falls back to the Call-ID hash, as for any unknown backend).
func (s *Server) ApplyDialog(ev DialogEvent) {
	if ev.CallID == "" || ev.Pool != "" && admission.CheckPoolName(ev.Pool) != nil {
		return
	}
	now := s.clock.Now()
	k := s.dialogs.key(ev.CallID, ev.FromTag)
	switch ev.Op {
	case DialogInsert:
		if ev.Backend != "" {
			s.insertDialog(k, ev.Pool, ev.Backend, now)
		}
	case DialogConfirm:
		if ev.ToTag != "" {
			s.dialogs.confirm(k, ev.ToTag)
		}
	case DialogRemove:
		s.dialogs.remove(k)
	case DialogEnd:
		s.dialogs.ended(ev.CallID, ev.FromTag, ev.ToTag, now)
	}
}

// ApplyRemoteDialog is ApplyDialog for a change from another node, with a
// bound: an insert is not applied (false) while the table holds max
// entries or more. Other nodes' dialogs, each inserted while the table
// held fewer than max, so never fill more than max entries, and the rest
// of the table stays for this node's own.
func (s *Server) ApplyRemoteDialog(ev DialogEvent, max int) bool {
	if ev.Op == DialogInsert && s.dialogs.Len() >= max {
		return false
	}
	s.ApplyDialog(ev)
	return true
}
