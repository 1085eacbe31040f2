package persist

import (
	"time"

	"github.com/sluicelb/sluice/admission"
)

// The parent (the balancer) and the store process speak over one stream
// socket (a socketpair whose child end is the store process's fd 3): each
// message is a 4-byte big-endian length and a JSON document, or for a
// write a binary message (frame.go). The parent
// sends a request and waits for its response; one request is in flight at
// a time. Both sides refuse a frame over maxFrame, so neither can make the
// other allocate without bound.
const maxFrame = 32 << 20

// Operations of the store protocol.
const (
	opPing        = "ping"        // -> ok; the child checks its directory
	opLoad        = "load"        // -> MOP, Overrides, ClusterNodes
	opWrite       = "write"       // MOP, Overrides?, ClusterNodes, Events, History, Dialogs, DeleteDialogs
	opEvents      = "events"      // Query -> Events, More, Omitted
	opSweep       = "sweep"       // Query.Before / Query.Max -> Deleted
	opHistory     = "history"     // Since -> History
	opLoadDialogs = "loaddialogs" // Now -> Dialogs
)

type request struct {
	Op string `json:"op"`

	MOP           map[string]admission.MOPState `json:"mop,omitempty"`
	Overrides     *[]Override                   `json:"overrides,omitempty"`
	ClusterNodes  int64                         `json:"cluster_nodes,omitempty"`
	Events        []seqEvent                    `json:"events,omitempty"`
	History       []HistorySample               `json:"history,omitempty"`
	Dialogs       []DialogRecord                `json:"dialogs,omitempty"`
	DeleteDialogs []uint64                      `json:"delete_dialogs,omitempty"`

	Query *EventQuery `json:"query,omitempty"`
	// After and Limit page dialogs (keys after After) and history
	// samples (Limit of them from Since), so that each answer fits a
	// message.
	After uint64    `json:"after,omitempty"`
	Limit int       `json:"limit,omitempty"`
	Since time.Time `json:"since,omitzero"`
	Now   time.Time `json:"now,omitzero"`
	// HistoryRetention and EventsRetention bound what the child keeps
	// (Badger TTL); zero or negative keeps forever.
	HistoryRetention time.Duration `json:"history_retention,omitempty"`
}

// seqEvent is an event with the sequence the balancer gave it when it
// first sent it (0: the store process numbers it). A write sent again
// after its answer was lost (the store process died after committing it)
// then writes the same keys: no event is stored twice.
type seqEvent struct {
	admission.Event
	Seq uint64 `json:"seq,omitempty"`
}

type response struct {
	Err string `json:"err,omitempty"`
	// Corrupt says Err is a record that does not decode (ErrCorrupt):
	// retrying cannot help.
	Corrupt bool `json:"corrupt,omitempty"`

	MOP          map[string]admission.MOPState `json:"mop,omitempty"`
	Overrides    []Override                    `json:"overrides,omitempty"`
	ClusterNodes int64                         `json:"cluster_nodes,omitempty"`
	LastSeq      uint64                        `json:"last_seq,omitempty"`
	Events       []admission.Event             `json:"events,omitempty"`
	More         bool                          `json:"more,omitempty"`
	Omitted      int                           `json:"omitted,omitempty"`
	Deleted      int                           `json:"deleted,omitempty"`
	History      []HistorySample               `json:"history,omitempty"`
	Dialogs      []DialogRecord                `json:"dialogs,omitempty"`
	// DialogPage answers opLoadDialogs: the records as one journal
	// message (decodeJournal), a third of their JSON's size and read
	// without parsing a time per record.
	DialogPage []byte `json:"dialog_page,omitempty"`
}
