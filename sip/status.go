package sip

import "strings"

// Status is the SIP front end's part of /status: what an operator asks
// first about calls ("how many dialogs does it hold, are they safe in
// the store, how many transactions and connections are open, is it
// refusing or dropping anything"), the same figures /metrics has.
type Status struct {
	// Dialogs is the dialog table: entries, its bound (-sip-dialog-max),
	// its estimated bytes, and what filled it other than INVITEs.
	Dialogs DialogsStatus `json:"dialogs"`
	// Transactions is the new work under way (INVITEs and other requests
	// waiting for a final answer, failed INVITEs lingering for their ACK).
	Transactions int `json:"transactions"`
	// Connections are the open stream connections by transport (tcp,
	// tls, ws, wss): clients and backends.
	Connections map[string]int64 `json:"connections"`
	// DialogStore is the write-through of the table to the data
	// directory: first 2xx held until their dialog was safe, those
	// relayed although it was not (store down or its socket full), and
	// changes not written (its queue was full).
	DialogStore DialogStoreStatus `json:"dialog_store"`
	// Counters since start.
	Requests        uint64 `json:"requests"`
	Responses       uint64 `json:"responses"`
	Relayed         uint64 `json:"relayed"`
	Refused         uint64 `json:"refused"`
	Failovers       uint64 `json:"failovers"`
	Timeouts        uint64 `json:"timeouts"`
	Malformed       uint64 `json:"malformed"`
	ForgedTokens    uint64 `json:"forged_tokens"`
	ForgedResponses uint64 `json:"forged_responses"`
	Loops           uint64 `json:"loops"`
	SipsRefused     uint64 `json:"sips_refused"`
	// UDPOwnDrops are datagrams dropped at sluice's own UDP socket (its
	// receive queue was full), TimeoutsOwnDrops the timeouts not charged
	// to a backend because of them.
	UDPOwnDrops      uint64 `json:"udp_own_drops"`
	TimeoutsOwnDrops uint64 `json:"timeouts_own_drops"`
}

// DialogsStatus is Status.Dialogs.
type DialogsStatus struct {
	Entries  int    `json:"entries"`
	Max      int    `json:"max"`
	Bytes    int64  `json:"bytes"`
	Restored uint64 `json:"restored"`
	Learned  uint64 `json:"learned"`
	// NotRecorded are INVITEs whose dialog was not recorded: the table
	// was full (raise -sip-dialog-max).
	NotRecorded uint64 `json:"not_recorded_full"`
}

// DialogStoreStatus is Status.DialogStore.
type DialogStoreStatus struct {
	Held    uint64 `json:"held_2xx"`
	Unsafe  uint64 `json:"unsafe_2xx"`
	Dropped uint64 `json:"dropped_changes"`
}

// Status returns the front end's Status now.
func (s *Server) Status() Status {
	m := &s.metrics
	st := Status{
		Dialogs: DialogsStatus{Entries: s.dialogs.Len(), Max: int(s.dialogs.max), Bytes: int64(s.dialogs.Bytes()),
			Restored: m.DialogsRestored.Load(), Learned: m.DialogsLearned.Load(), NotRecorded: m.DialogsFull.Load()},
		Transactions: s.txns.Len(),
		Connections:  map[string]int64{},
		DialogStore:  DialogStoreStatus{Held: m.DialogStoreHeld.Load(), Unsafe: m.DialogStoreUnsafe.Load(), Dropped: m.DialogStoreDropped.Load()},
		Requests:     m.Requests.Load(), Responses: m.Responses.Load(), Relayed: m.Relayed.Load(), Refused: m.Refused.Load(),
		Failovers: m.Failovers.Load(), Timeouts: m.Timeouts.Load(), Malformed: m.Malformed.Load(),
		ForgedTokens: m.ForgedTokens.Load(), ForgedResponses: m.ForgedResponses.Load(), Loops: m.Loops.Load(),
		SipsRefused: m.SipsRefused.Load(), UDPOwnDrops: m.OwnDrops.Load(), TimeoutsOwnDrops: m.TimeoutsOwnDrops.Load(),
	}
	for k := range s.tcp.byKind {
		st.Connections[strings.ToLower(connKind(k).String())] = s.tcp.byKind[k].Load()
	}
	return st
}
