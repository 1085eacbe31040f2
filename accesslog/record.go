// Package accesslog writes one line per HTTP request and per SIP
// transaction that sluice forwarded or answered, and hands the same records
// to other consumers (Sink: tracing). Front ends fill a record on their own
// goroutine and call Logger.LogHTTP or Logger.LogSIP, which copy it into a
// bounded ring and return at once; one writer goroutine formats the lines
// (json, logfmt or combined) and writes them to stdout, a file (reopened on
// SIGUSR1) or syslog (RFC 5424 over UDP, TCP or a unix socket). When the
// destination is slower than the traffic the ring fills and records are
// dropped and counted, never queued without bound, and a front end never
// waits for the log.
//
// The package imports nothing of sluice's other packages: a record carries
// plain values (strings that live as long as the configuration, bytes the
// logger copies), so http, sip and the tracer all build on it.
package accesslog

import (
	"net/netip"
	"time"
)

// Class is the admission class of a request.
type Class uint8

const (
	// ClassNew is new work: it went through admission.
	ClassNew Class = iota
	// ClassAffinity belongs to a session or call under way: always admitted.
	ClassAffinity
)

// String is the word used in log lines: "new" or "affinity".
func (c Class) String() string {
	if c == ClassAffinity {
		return "affinity"
	}
	return "new"
}

// Decision is what admission (or routing) decided for a request.
type Decision uint8

const (
	// Admitted went on at once.
	Admitted Decision = iota
	// Delayed waited in an ARM delay queue (the wait is the record's
	// AdmissionWait), then went on.
	Delayed
	// Refused was answered by sluice itself; the record's Reason says why.
	Refused
)

// String is the word used in log lines.
func (d Decision) String() string {
	switch d {
	case Delayed:
		return "delayed"
	case Refused:
		return "refused"
	}
	return "admitted"
}

// End is how an HTTP exchange ended.
type End uint8

const (
	// EndComplete: the answer was sent whole.
	EndComplete End = iota
	// EndClientAbort: the client went away before the answer was sent.
	EndClientAbort
	// EndBackendReset: the backend closed or reset the connection.
	EndBackendReset
	// EndTimeout: a deadline ran out (backend connect, answer or idle).
	EndTimeout
	// EndRefused: sluice answered the request itself (no backend exchange).
	EndRefused
)

// String is the word used in log lines.
func (e End) String() string {
	switch e {
	case EndClientAbort:
		return "client_abort"
	case EndBackendReset:
		return "backend_reset"
	case EndTimeout:
		return "timeout"
	case EndRefused:
		return "refused"
	}
	return "complete"
}

// MaxRetries is how many retry backends a record keeps; more are counted
// in Retries but not named.
const MaxRetries = 4

// HTTPRecord is one HTTP request. Strings are values that outlive the
// request (pool, route and backend names from the configuration); byte
// slices may view the caller's buffers: LogHTTP copies them (each cut at
// the logger's record size) before it returns, so the caller may reuse the
// record and its buffers at once.
type HTTPRecord struct {
	Start  time.Time      // when the first byte of the request head was read
	Client netip.AddrPort // the peer address
	// Forwarded is the client address a trusted proxy gave
	// (X-Forwarded-For, Forwarded); invalid when none or not trusted.
	Forwarded  netip.Addr
	TLSVersion uint16 // crypto/tls version number; 0: plain TCP
	SNI        []byte // the TLS server name, when any

	Method []byte
	Host   []byte
	Path   []byte // the request target without its query
	Query  []byte // the query without '?'; logged only with Options.Query
	Proto  string // "HTTP/1.1", "HTTP/1.0", "HTTP/2.0"
	Status int    // the status sent to the client; 0 when none was sent

	BytesIn  int64 // request bytes read (head and body)
	BytesOut int64 // answer bytes written (head and body)

	Pool    string // "" when the request reached no pool
	Route   string // the route that gave the pool; "" for the default pool
	Backend string // the backend that answered (the last one tried)

	Class    Class
	Decision Decision
	// Reason says why a request was refused (or delayed): the node memory
	// state ("memory state lower"), the ARM rule ("arm rule api-burst pool
	// api"), "mop pool static", "no route", "no backend", ... Copied.
	Reason []byte

	Retries       int                // how many times the request was sent to another backend
	RetryBackends [MaxRetries]string // the backends tried before Backend, in order

	// Timings, each from Start; 0 when the step did not happen.
	HeadRead      time.Duration // the request head was read whole
	AdmissionWait time.Duration // time spent in an ARM delay
	Connect       time.Duration // the backend connection was ready (dialled or reused)
	FirstByte     time.Duration // the first byte of the answer arrived from the backend
	Total         time.Duration // the answer was sent (or the exchange ended)

	RequestID  []byte   // X-Request-ID sent to the backend and in refusals
	TraceID    [16]byte // from the client's traceparent; zero when none
	ParentSpan [8]byte  // the parent span id of the client's traceparent
	TraceFlags byte     // the traceparent's flags (bit 0: sampled)
	HasTrace   bool     // a valid traceparent came with the request
	UserAgent  []byte   // for the combined format
	Referer    []byte   // for the combined format

	End End
}

// Producer says who produced a SIP final status.
type Producer uint8

const (
	// ByBackend: the backend's answer, relayed.
	ByBackend Producer = iota
	// BySluice: sluice answered itself (503 refusal, 408 timeout, 480, 481).
	BySluice
)

// String is the word used in log lines.
func (p Producer) String() string {
	if p == BySluice {
		return "sluice"
	}
	return "backend"
}

// SIPKind tells a transaction record from a dialog summary.
type SIPKind uint8

const (
	// SIPTransaction is one transaction sluice forwarded or answered.
	SIPTransaction SIPKind = iota
	// SIPDialogEnd is one summary line per dialog when it ends (a CDR).
	SIPDialogEnd
)

// String is the word used in log lines.
func (k SIPKind) String() string {
	if k == SIPDialogEnd {
		return "dialog"
	}
	return "transaction"
}

// SIPRecord is one SIP transaction (or, Kind SIPDialogEnd, one ended
// dialog). Its strings come from the parsed message, which the SIP front
// end allocates anyway; LogSIP keeps them as they are (strings do not
// change), so the caller may reuse the record at once.
type SIPRecord struct {
	Kind   SIPKind
	Start  time.Time // when the request arrived
	Method string
	RURI   string // the Request-URI; its user part is masked with Options.MaskUser
	CallID string
	// FromTag and ToTag are the dialog's tags; ToTag is empty outside a dialog.
	FromTag, ToTag string
	CSeq           uint32
	Transport      string         // "udp", "tcp", "tls"
	Source         netip.AddrPort // where the request came from

	Pool    string
	Backend string // the backend that gave the final answer (the last one tried)

	Status     int // the final status; 0 when none (a timeout without answer sent)
	StatusFrom Producer

	Class    Class
	Decision Decision
	Reason   string // why sluice refused it (memory state, ARM rule, MOP)

	Failovers        int                // how many times the transaction moved to another backend
	FailoverBackends [MaxRetries]string // the backends tried before Backend, in order

	Provisional time.Duration // first provisional answer (1xx), from Start; 0: none
	Final       time.Duration // final answer, from Start

	// Dialog summaries (Kind SIPDialogEnd).
	Duration time.Duration // from the 2xx to the BYE
	ByeSide  string        // "caller", "callee" or "" (timed out)

	TraceID    [16]byte
	ParentSpan [8]byte
	TraceFlags byte
	HasTrace   bool
}
