package accesslog

import (
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Format is the shape of a log line.
type Format uint8

const (
	// JSON is one JSON object per line, every field always present.
	JSON Format = iota
	// Logfmt is key=value pairs, values quoted where needed.
	Logfmt
	// Combined is the Apache/nginx combined format, for tools that
	// already parse it (the extra fields are not in it).
	Combined
)

// String is the flag's spelling.
func (f Format) String() string {
	switch f {
	case Logfmt:
		return "logfmt"
	case Combined:
		return "combined"
	}
	return "json"
}

// ParseFormat reads -access-log-format: json, logfmt or combined.
func ParseFormat(s string) (Format, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "json":
		return JSON, nil
	case "logfmt":
		return Logfmt, nil
	case "combined":
		return Combined, nil
	}
	return 0, fmt.Errorf("-access-log-format %q: want json, logfmt or combined", s)
}

// Sample is the share of records logged per class, each in [0, 1].
// A refusal is counted as refused whatever its class.
type Sample struct {
	Refused  float64
	New      float64
	Affinity float64
}

// DefaultSample logs every record.
var DefaultSample = Sample{Refused: 1, New: 1, Affinity: 1}

// String is the flag's spelling.
func (s Sample) String() string {
	f := func(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }
	return "refused=" + f(s.Refused) + ",new=" + f(s.New) + ",affinity=" + f(s.Affinity)
}

// ParseSample reads -access-log-sample: comma-separated CLASS=RATE with
// CLASS refused, new or affinity and RATE in [0, 1]; a class not named
// keeps its rate from DefaultSample (1: logged).
func ParseSample(s string) (Sample, error) {
	out := DefaultSample
	if strings.TrimSpace(s) == "" {
		return out, nil
	}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if !ok {
			return out, fmt.Errorf("-access-log-sample %q: %q is not CLASS=RATE (classes refused, new, affinity)", s, kv)
		}
		r, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err != nil || !(r >= 0 && r <= 1) {
			return out, fmt.Errorf("-access-log-sample %q: rate %q of %s: want a number from 0 to 1", s, v, k)
		}
		switch strings.ToLower(strings.TrimSpace(k)) {
		case "refused":
			out.Refused = r
		case "new":
			out.New = r
		case "affinity":
			out.Affinity = r
		default:
			return out, fmt.Errorf("-access-log-sample %q: class %q: want refused, new or affinity", s, k)
		}
	}
	return out, nil
}

func (s *Sample) rate(c Class, d Decision) float64 {
	switch {
	case d == Refused:
		return s.Refused
	case c == ClassAffinity:
		return s.Affinity
	}
	return s.New
}

// keep draws whether a record with this rate is logged.
func keep(rate float64) bool {
	if rate >= 1 {
		return true
	}
	if rate <= 0 {
		return false
	}
	return rand.Float64() < rate
}

// Sink is another consumer of the records (the tracer). Want* run on the
// caller of LogHTTP/LogSIP, on the data plane: they must be quick, must
// not block and say whether the sink wants this record (its own sampling).
// Write* run on the writer goroutine of the record's protocol, after the line was
// formatted: line is the log line (without its newline) or nil when the
// log's sampling left the record out or there is no destination for its
// protocol. A record and line are valid only during the call. When the
// two protocols have different destinations each has its own writer, so
// WriteHTTP and WriteSIP may run at the same time. A slow Write makes the
// ring fill and records be dropped, as a slow destination does.
type Sink interface {
	WantHTTP(r *HTTPRecord) bool
	WantSIP(r *SIPRecord) bool
	WriteHTTP(r *HTTPRecord, line []byte)
	WriteSIP(r *SIPRecord, line []byte)
}

// Options configure a Logger.
type Options struct {
	// Dest is where lines of both protocols go (-access-log): "-" for
	// stdout, a file path, syslog://HOST:PORT (UDP), syslog+udp://,
	// syslog+tcp://HOST:PORT or syslog+unix:///dev/log; "" or "off" for
	// none. HTTPDest and SIPDest (-http-access-log, -sip-access-log), when
	// set, replace it for their protocol ("off": none for that protocol).
	// Two protocols naming the same file or syslog share one destination.
	Dest, HTTPDest, SIPDest string
	// Format of every line (-access-log-format).
	Format Format
	// Sample is the share logged per class (-access-log-sample); the zero
	// value logs nothing: use DefaultSample.
	Sample Sample
	// Query logs the query string of HTTP requests (-access-log-query):
	// off by default, as queries carry tokens and personal data.
	Query bool
	// MaskUser replaces the user part of SIP Request-URIs with '*'
	// (-access-log-mask-user).
	MaskUser bool
	// RingSize is how many records per protocol wait for the writer
	// (rounded up to a power of two); 0: DefaultRingSize.
	RingSize int
	// RecordBytes bounds the bytes an HTTP record's copied fields (path,
	// host, user agent, ...) keep; longer fields are cut. 0:
	// DefaultRecordBytes.
	RecordBytes int
	// Sinks get every record they want, logged or not.
	Sinks []Sink
	// Hostname and AppName are the RFC 5424 HOSTNAME and APP-NAME of
	// syslog messages; "": os.Hostname() and "sluice".
	Hostname, AppName string
	// Log gets a WARN when a destination fails (a write, a reopen, a
	// dial), at most one per WarnEvery per destination, with the count of
	// failures since the last; nil: slog.Default().
	Log *slog.Logger
	// Now is the clock of those warnings and of syslog redials; nil:
	// time.Now.
	Now func() time.Time
}

// WarnEvery is how often a failing destination is reported at most.
const WarnEvery = 10 * time.Second

// DefaultRingSize is the ring per protocol when Options.RingSize is 0.
const DefaultRingSize = 4096

// DefaultRecordBytes is Options.RecordBytes when 0.
const DefaultRecordBytes = 1024

// Proto names a protocol's log for counters.
type Proto uint8

const (
	HTTP Proto = iota
	SIP
)

// String is "http" or "sip" (the proto label of the metrics).
func (p Proto) String() string {
	if p == SIP {
		return "sip"
	}
	return "http"
}

// Stats are a Logger's counters, per protocol.
type Stats struct {
	Logged  [2]uint64 // records taken into the ring
	Dropped [2]uint64 // records the ring had no room for
	Written [2]uint64 // lines the destination took whole
	// Lost counts lines that did not reach their destination: a failed
	// or short write (a full disk, a pipe nobody reads), a syslog
	// receiver down or refusing.
	Lost [2]uint64
	// WriteErrors counts failed writes, opens and dials of the
	// destinations (their lines are counted in Lost).
	WriteErrors uint64
}

// Logger takes records from the front ends and writes them from one
// goroutine per destination (writer.go): a destination that blocks (a
// pipe nobody reads) stalls its own protocol's log, not the other's. A
// nil *Logger takes nothing and costs nothing: front ends call it
// unconditionally.
type Logger struct {
	opts    Options
	http    *ring[HTTPRecord]
	sip     *ring[SIPRecord]
	dest    [2]dest    // per protocol; nil: none
	writers []*writer  // one per distinct destination
	writer  [2]*writer // the writer of each protocol's ring
	// wakeEvery: a record wakes its writer at every wakeEvery-th
	// position of its ring (an eighth of it), and the writer also looks
	// every writerTick: one wake-up per record cost the traffic a
	// goroutine switch and the file a write per record at low load.
	wakeEvery uint64
	closed    atomic.Bool // Close was called: records are dropped
	quit      chan struct{}
	once      sync.Once

	logged, dropped   [2]atomic.Uint64
	acc               accounts // written and lost, kept by the destinations
	errs              atomic.Uint64
	wantHTTP, wantSIP bool // a destination or a sink for the protocol
}

// New checks opts, opens the destinations and starts the writer. Errors
// name the flag and the value.
func New(opts Options) (*Logger, error) {
	if opts.RingSize < 0 || opts.RingSize > 1<<20 {
		return nil, fmt.Errorf("access log ring size %d: want 0 (default %d) to %d", opts.RingSize, DefaultRingSize, 1<<20)
	}
	if opts.RecordBytes < 0 || opts.RecordBytes > 1<<16 {
		return nil, fmt.Errorf("access log record bytes %d: want 0 (default %d) to %d", opts.RecordBytes, DefaultRecordBytes, 1<<16)
	}
	for _, r := range []float64{opts.Sample.Refused, opts.Sample.New, opts.Sample.Affinity} {
		if !(r >= 0 && r <= 1) {
			return nil, fmt.Errorf("-access-log-sample %s: rates must be from 0 to 1", opts.Sample)
		}
	}
	if opts.Format > Combined {
		return nil, fmt.Errorf("-access-log-format %d: want json, logfmt or combined", opts.Format)
	}
	if opts.RingSize == 0 {
		opts.RingSize = DefaultRingSize
	}
	if opts.RecordBytes == 0 {
		opts.RecordBytes = DefaultRecordBytes
	}
	if opts.AppName == "" {
		opts.AppName = "sluice"
	}
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	specs := [2]string{opts.Dest, opts.Dest}
	flags := [2]string{"-access-log", "-access-log"}
	if opts.HTTPDest != "" {
		specs[HTTP], flags[HTTP] = opts.HTTPDest, "-http-access-log"
	}
	if opts.SIPDest != "" {
		specs[SIP], flags[SIP] = opts.SIPDest, "-sip-access-log"
	}
	l := &Logger{
		opts:      opts,
		wakeEvery: uint64(max(opts.RingSize/8, 1)),
		quit:      make(chan struct{}),
	}
	var dests []dest
	closeDests := func() {
		for _, d := range dests {
			d.close()
		}
	}
	byKey := map[string]dest{}
	for p := range specs {
		spec, err := ParseDest(specs[p])
		if err != nil {
			closeDests()
			return nil, fmt.Errorf("%s %q: %w", flags[p], specs[p], err)
		}
		if spec.Kind == DestOff {
			continue
		}
		if d, ok := byKey[spec.key()]; ok {
			l.dest[p] = d
			continue
		}
		d, err := openDest(spec, &l.opts, &l.acc)
		if err != nil {
			closeDests()
			return nil, fmt.Errorf("%s %q: %w", flags[p], specs[p], err)
		}
		byKey[spec.key()] = d
		l.dest[p] = d
		dests = append(dests, d)
	}
	l.wantHTTP = l.dest[HTTP] != nil || len(opts.Sinks) > 0
	l.wantSIP = l.dest[SIP] != nil || len(opts.Sinks) > 0
	// A protocol nothing wants gets no ring worth the name: the memory
	// (RingSize records, and RecordBytes each for HTTP) is not taken.
	size := func(want bool) int {
		if want {
			return opts.RingSize
		}
		return 1
	}
	l.http = newRing[HTTPRecord](size(l.wantHTTP), opts.RecordBytes)
	l.sip = newRing[SIPRecord](size(l.wantSIP), 0)
	// One writer per destination: both protocols' rings when they share
	// one (or neither has one), else a writer per protocol.
	if l.dest[HTTP] == l.dest[SIP] {
		w := l.newWriter(l.dest[HTTP], true, true)
		l.writer = [2]*writer{w, w}
	} else {
		l.writer = [2]*writer{l.newWriter(l.dest[HTTP], true, false), l.newWriter(l.dest[SIP], false, true)}
	}
	for _, w := range l.writers {
		if sd, ok := w.d.(*syslogDest); ok && sd.startErr != nil {
			w.fail("dial", sd.startErr)
		}
		go w.run()
	}
	return l, nil
}

// Enabled reports whether records of protocol p go anywhere: a front end
// may skip filling a record when not.
func (l *Logger) Enabled(p Proto) bool {
	if l == nil {
		return false
	}
	if p == SIP {
		return l.wantSIP
	}
	return l.wantHTTP
}

// LogHTTP copies r into the ring for the writer, when the log's sampling
// or a sink wants it. It never blocks and does not allocate; when the ring
// is full the record is dropped and counted. The caller may reuse r and
// the buffers it views as soon as LogHTTP returns.
func (l *Logger) LogHTTP(r *HTTPRecord) {
	if l == nil || !l.wantHTTP {
		return
	}
	logged := l.dest[HTTP] != nil && keep(l.opts.Sample.rate(r.Class, r.Decision))
	var sinks uint64
	for i, s := range l.opts.Sinks {
		if i < 64 && s.WantHTTP(r) {
			sinks |= 1 << i
		}
	}
	if logged || sinks != 0 {
		enqueue(l, HTTP, l.http, r, logged, sinks, copyHTTP)
	}
}

// LogSIP is LogHTTP for a SIP record.
func (l *Logger) LogSIP(r *SIPRecord) {
	if l == nil || !l.wantSIP {
		return
	}
	logged := l.dest[SIP] != nil && keep(l.opts.Sample.rate(r.Class, r.Decision))
	var sinks uint64
	for i, s := range l.opts.Sinks {
		if i < 64 && s.WantSIP(r) {
			sinks |= 1 << i
		}
	}
	if logged || sinks != 0 {
		enqueue(l, SIP, l.sip, r, logged, sinks, copySIP)
	}
}

// enqueue puts r into rg, the ring of protocol p, counting it logged or
// dropped, and wakes the writer at every wakeEvery-th position (or at once
// when the ring is full).
func enqueue[T any](l *Logger, p Proto, rg *ring[T], r *T, logged bool, sinks uint64, cp func(dst *T, arena []byte, src *T) []byte) {
	if l.closed.Load() {
		l.dropped[p].Add(1)
		return
	}
	ok, pos := rg.put(r, logged, sinks, cp)
	if !ok {
		l.dropped[p].Add(1)
		l.writer[p].poke()
		return
	}
	l.logged[p].Add(1)
	if pos%l.wakeEvery == 0 {
		l.writer[p].poke()
	}
}

// Stats returns the counters.
func (l *Logger) Stats() Stats {
	var s Stats
	if l == nil {
		return s
	}
	for p := range 2 {
		s.Logged[p] = l.logged[p].Load()
		s.Dropped[p] = l.dropped[p].Load()
		s.Written[p] = l.acc.written[p].Load()
		s.Lost[p] = l.acc.lost[p].Load()
	}
	s.WriteErrors = l.errs.Load()
	return s
}

// Reopen asks the writer to reopen file destinations (after logrotate
// renamed them: SIGUSR1) and to reconnect syslog streams. It returns at
// once; lines written before the reopen go to the old file.
func (l *Logger) Reopen() {
	if l == nil {
		return
	}
	for _, w := range l.writers {
		w.reopen.Store(true)
		w.poke()
	}
}

// Close writes what the ring holds, stops the writer and closes the
// destinations; records logged after Close are dropped (and counted). A
// destination that takes nothing for 5 s (a full pipe nobody
// reads) is given up: Close returns an error and the rest is lost. A
// second Close returns nil.
func (l *Logger) Close() error {
	if l == nil {
		return nil
	}
	first := false
	l.once.Do(func() {
		first = true
		l.closed.Store(true)
		close(l.quit)
	})
	if !first {
		return nil
	}
	var errs []error
	limit := time.NewTimer(closeTimeout)
	defer limit.Stop()
	expired := false
	for _, w := range l.writers {
		if !expired {
			select {
			case <-w.done:
			case <-limit.C:
				expired = true
			}
		}
		if expired {
			select {
			case <-w.done:
			default:
				// Given up: its records still queued are lost.
				errs = append(errs, fmt.Errorf("access log %s: the destination took nothing for %v: the records still queued are lost", destName(w.d), closeTimeout))
				continue
			}
		}
		if w.d != nil {
			if err := w.d.close(); err != nil {
				errs = append(errs, fmt.Errorf("access log %s: %w", w.d, err))
			}
		}
	}
	return errors.Join(errs...)
}

// closeTimeout bounds how long Close waits for a blocked destination.
var closeTimeout = 5 * time.Second
