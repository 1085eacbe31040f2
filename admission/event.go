package admission

import "time"

// EventKind names what happened. Kinds are stable strings: they are stored in
// the event log and matched by operators' tooling.
type EventKind string

// Event kinds written by this package.
const (
	EventMemoryState   EventKind = "memory.state"    // node memory state changed
	EventARMEngaged    EventKind = "arm.engaged"     // a rule reached its limit and started to delay or refuse
	EventARMReleased   EventKind = "arm.released"    // a rule's rate fell below its limit again
	EventARMRefusing   EventKind = "arm.refusing"    // a rule refused a request (queue full, wait over, or reject action)
	EventARMWouldLimit EventKind = "arm.would_limit" // an action=log rule went over its limit
	EventMOPPhase      EventKind = "mop.phase"       // a backend's MOP phase changed
	EventMOPLearned    EventKind = "mop.learned"     // a backend's learned rate changed
	EventMOPEstimate   EventKind = "mop.estimate"    // a backend's sessions changed regime: bytes per session or lifetime (a deploy)
	EventConfigWarning EventKind = "config.warning"  // a configuration value was ignored or adjusted
	EventConfigReload  EventKind = "config.reload"   // the backends were re-read (SIGHUP)
	EventBackendState  EventKind = "backend.state"   // a backend went up, down or draining by its health checks
)

// Event is one entry of the event log. Subject names the rule, backend or
// setting the event is about.
type Event struct {
	Time    time.Time `json:"time"`
	Kind    EventKind `json:"kind"`
	Subject string    `json:"subject,omitempty"`
	Message string    `json:"message"`
}

// EventSink receives events. It is called from slow paths only (state
// transitions, window ends), never per admitted request, but it may be called
// from several goroutines at once and must not block for long.
type EventSink func(Event)

func (s EventSink) emit(kind EventKind, subject, msg string) {
	if s != nil {
		s(Event{Time: time.Now(), Kind: kind, Subject: subject, Message: msg})
	}
}
