package accesslog

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// DestKind is the kind of a destination.
type DestKind uint8

const (
	DestOff DestKind = iota
	DestStdout
	DestFile
	DestSyslogUDP
	DestSyslogTCP
	DestSyslogUnix
)

// DestSpec is a parsed destination.
type DestSpec struct {
	Kind DestKind
	// Path is the file (DestFile) or the socket (DestSyslogUnix); Addr is
	// HOST:PORT for syslog over the network.
	Path, Addr string
	// Facility is the syslog facility number (?facility=local0..local7,
	// user, daemon; default local0).
	Facility int
}

func (s DestSpec) key() string {
	return strconv.Itoa(int(s.Kind)) + "\x00" + s.Path + "\x00" + s.Addr
}

var facilities = map[string]int{
	"kern": 0, "user": 1, "daemon": 3, "auth": 4, "syslog": 5,
	"local0": 16, "local1": 17, "local2": 18, "local3": 19,
	"local4": 20, "local5": 21, "local6": 22, "local7": 23,
}

// ParseDest reads a destination: "" or "off", "-" (stdout), a file path,
// syslog://HOST:PORT or syslog+udp://HOST:PORT, syslog+tcp://HOST:PORT,
// syslog+unix:///PATH; a syslog destination may add ?facility=NAME.
func ParseDest(s string) (DestSpec, error) {
	switch s {
	case "", "off", "none":
		return DestSpec{Kind: DestOff}, nil
	case "-", "stdout":
		return DestSpec{Kind: DestStdout}, nil
	}
	scheme, _, found := strings.Cut(s, "://")
	if !found || !strings.HasPrefix(scheme, "syslog") {
		if strings.Contains(s, "://") {
			return DestSpec{}, fmt.Errorf("scheme %q: want syslog://, syslog+udp://, syslog+tcp://, syslog+unix://, a file path or -", scheme)
		}
		if strings.ContainsRune(s, 0) {
			return DestSpec{}, errors.New("a file path may not hold a NUL byte")
		}
		return DestSpec{Kind: DestFile, Path: s}, nil
	}
	u, err := url.Parse(s)
	if err != nil {
		return DestSpec{}, fmt.Errorf("not a URL: %v", err)
	}
	spec := DestSpec{Facility: 16}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return DestSpec{}, fmt.Errorf("query %q: %v", u.RawQuery, err)
	}
	for k := range q {
		if k != "facility" {
			return DestSpec{}, fmt.Errorf("query parameter %q: the only one known is facility (?facility=local0..local7, user, daemon, auth, syslog or kern)", k)
		}
	}
	if f := q.Get("facility"); f != "" {
		n, ok := facilities[strings.ToLower(f)]
		if !ok {
			return DestSpec{}, fmt.Errorf("facility %q: want local0..local7, user, daemon, auth, syslog or kern", f)
		}
		spec.Facility = n
	}
	switch u.Scheme {
	case "syslog", "syslog+udp", "syslog+tcp":
		if u.Path != "" && u.Path != "/" {
			return DestSpec{}, fmt.Errorf("a network syslog takes HOST:PORT, not a path (%q)", u.Path)
		}
		host, port, err := net.SplitHostPort(u.Host)
		if err != nil || host == "" {
			return DestSpec{}, errors.New("want syslog[+udp|+tcp]://HOST:PORT")
		}
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return DestSpec{}, fmt.Errorf("port %q: want 1 to 65535", port)
		}
		spec.Addr = u.Host
		spec.Kind = DestSyslogUDP
		if u.Scheme == "syslog+tcp" {
			spec.Kind = DestSyslogTCP
		}
	case "syslog+unix":
		if u.Host != "" || u.Path == "" {
			return DestSpec{}, errors.New("want syslog+unix:///PATH (three slashes, an absolute path)")
		}
		spec.Kind, spec.Path = DestSyslogUnix, u.Path
	default:
		return DestSpec{}, fmt.Errorf("scheme %q: want syslog://, syslog+udp://, syslog+tcp:// or syslog+unix://", u.Scheme)
	}
	return spec, nil
}

// dest is where a writer puts lines. add frames and buffers one line (a
// stream) or sends it (a datagram); flush writes what is buffered. A dest
// counts each line it was given exactly once, in its accounts: written
// when its last byte reached the destination, lost when it did not (a
// failed or short write, no connection). An error returned is for the
// writer's counter and warning; the lines are already accounted for.
// Only the destination's writer goroutine calls them, except close after
// the writer ended.
type dest interface {
	add(line []byte, p Proto, t time.Time) error
	flush() error
	reopen() error
	close() error
	// String names the destination for warnings: a path, "stdout" or
	// the syslog URL.
	String() string
}

// accounts are a Logger's line counters, shared by its destinations.
type accounts struct {
	written, lost [2]atomic.Uint64
}

// pending is a stream destination's buffer: lines not written yet, and
// where each ends, so that a failed or short write counts exactly the
// lines that did not reach the destination as lost.
type pending struct {
	buf  []byte
	ends []lineEnd
	acc  *accounts
}

type lineEnd struct {
	end int // offset in buf after the line's last byte
	p   Proto
}

// mark notes that a line of p ends at the end of buf.
func (q *pending) mark(p Proto) { q.ends = append(q.ends, lineEnd{len(q.buf), p}) }

// settle counts the lines whose last byte is among the n bytes written
// as written and the others as lost, and empties the buffer.
func (q *pending) settle(n int) {
	for _, e := range q.ends {
		if e.end <= n {
			q.acc.written[e.p].Add(1)
		} else {
			q.acc.lost[e.p].Add(1)
		}
	}
	q.buf, q.ends = q.buf[:0], q.ends[:0]
}

// drop counts every buffered line lost and empties the buffer.
func (q *pending) drop() { q.settle(-1) }

// write writes the buffer to w and settles it: a write that took fewer
// bytes than asked without saying why is io.ErrShortWrite. n is how many
// bytes w took.
func (q *pending) write(w io.Writer) (n int, err error) {
	if len(q.buf) == 0 {
		return 0, nil
	}
	n, err = w.Write(q.buf)
	if err == nil && n < len(q.buf) {
		err = io.ErrShortWrite
	}
	q.settle(n)
	return n, err
}

func openDest(spec DestSpec, o *Options, acc *accounts) (dest, error) {
	switch spec.Kind {
	case DestStdout:
		return &fileDest{w: os.Stdout, stdout: true, q: pending{acc: acc}, timeout: writeTimeout}, nil
	case DestFile:
		d := &fileDest{path: spec.Path, q: pending{acc: acc}, timeout: writeTimeout}
		if err := d.reopen(); err != nil {
			return nil, err
		}
		return d, nil
	default:
		d := &syslogDest{spec: spec, app: o.AppName, host: o.Hostname, pid: strconv.Itoa(os.Getpid()), q: pending{acc: acc}, now: o.Now, timeout: writeTimeout}
		if d.host == "" {
			d.host, _ = os.Hostname()
		}
		d.host = syslogToken(d.host)
		d.app = syslogToken(d.app)
		if err := d.dial(); err != nil {
			// A name that does not resolve is a mistake in the flag; a
			// receiver that does not answer yet (not started, restarting)
			// is not: the lines are lost and counted until it does, as
			// when it goes away at run time.
			var dns *net.DNSError
			if errors.As(err, &dns) {
				return nil, err
			}
			d.startErr = err
		}
		return d, nil
	}
}

// syslogToken makes s a valid RFC 5424 header token: printable US-ASCII
// without spaces, "-" when empty.
func syslogToken(s string) string {
	b := []byte(s)
	n := 0
	for _, c := range b {
		if c > 32 && c < 127 {
			b[n] = c
			n++
		}
	}
	if n == 0 {
		return "-"
	}
	if n > 48 {
		n = 48
	}
	return string(b[:n])
}

// maxBuffer is when the writer writes a stream destination's buffer
// without waiting for the ring to empty.
const maxBuffer = 64 << 10

// writeTimeout bounds a write to a syslog connection or a pipe, so a
// receiver that stopped reading costs its destination's lines, not the
// writer forever, and Close ends. A variable for the tests.
var writeTimeout = 5 * time.Second

// fileDest is stdout or a file opened for appending. O_APPEND makes it
// safe under logrotate's copytruncate: after the copy truncates the file,
// the next write lands at its new end, not at the old offset (no hole of
// zeros). reopen opens the path again (after a rename: SIGUSR1). A pipe
// (a FIFO) gets a write deadline: a reader that stopped reading loses
// lines, counted, instead of stalling the writer for good.
type fileDest struct {
	path     string
	w        io.Writer // f, or stdout, or a test's writer
	f        *os.File  // the file opened; nil for stdout
	stdout   bool
	deadline bool // f takes write deadlines (a pipe)
	// cut: a write stopped inside a line, which the file now ends with;
	// the next write starts with a newline, so that only that line is
	// damaged, not the next.
	cut     bool
	q       pending
	timeout time.Duration // writeTimeout when opened
}

func (d *fileDest) String() string {
	if d.stdout {
		return "stdout"
	}
	return d.path
}

func (d *fileDest) add(line []byte, p Proto, _ time.Time) error {
	if d.cut && len(d.q.buf) == 0 {
		d.q.buf = append(d.q.buf, '\n')
	}
	d.q.buf = append(d.q.buf, line...)
	d.q.buf = append(d.q.buf, '\n')
	d.q.mark(p)
	if len(d.q.buf) >= maxBuffer {
		return d.flush()
	}
	return nil
}

func (d *fileDest) flush() error {
	if len(d.q.buf) == 0 {
		return nil
	}
	if d.w == nil {
		d.q.drop()
		return errNotOpen
	}
	if d.deadline {
		d.f.SetWriteDeadline(time.Now().Add(d.timeout))
	}
	buf := d.q.buf // settled by write, its bytes unchanged
	n, err := d.q.write(d.w)
	if err != nil {
		// What was written of the buffer ends inside a line unless it
		// ends with a newline; a write that took nothing leaves the
		// file as it was.
		if n > 0 {
			d.cut = buf[n-1] != '\n'
		}
		return err
	}
	d.cut = false
	return nil
}

// errNotOpen: a file destination whose open failed.
var errNotOpen = errors.New("not open")

func (d *fileDest) reopen() error {
	if d.stdout {
		return nil
	}
	f, err := os.OpenFile(d.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o640)
	if err != nil {
		return fmt.Errorf("open: %w", err)
	}
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() && fi.Mode()&os.ModeNamedPipe == 0 && fi.Mode()&os.ModeCharDevice == 0 {
		f.Close()
		return fmt.Errorf("%s is not a regular file, a pipe or a character device", d.path)
	}
	var err2 error
	if d.f != nil {
		if err2 = d.flush(); err2 != nil {
			err2 = fmt.Errorf("write before reopen: %w", err2)
		}
		d.f.Close()
	}
	d.f, d.w, d.cut = f, f, false
	// Only a file the runtime polls (a pipe) takes a deadline; a regular
	// file says os.ErrNoDeadline.
	d.deadline = f.SetWriteDeadline(time.Time{}) == nil
	return err2
}

func (d *fileDest) close() error {
	err := d.flush()
	if d.f != nil {
		if cerr := d.f.Close(); err == nil {
			err = cerr
		}
		d.f, d.w = nil, nil
	}
	return err
}

// syslogDest sends RFC 5424 messages: one datagram per line over UDP and
// a unix datagram socket, octet-counted framing (RFC 6587 3.4.1) over TCP
// and a unix stream socket. A connection that fails is dialled again at a
// flush, at most once a second (redialEvery); lines meanwhile are lost and
// counted. Over UDP a line is lost unseen when the receiver is down: a
// send fails only after an ICMP refusal of an earlier one.
type syslogDest struct {
	spec      DestSpec
	app, host string
	pid       string
	conn      net.Conn
	stream    bool
	msg       []byte
	q         pending
	now       func() time.Time
	lastDial  time.Time // of the last failed dial
	// startErr is why the first dial failed, at New: the writer warns.
	startErr error
	timeout  time.Duration // writeTimeout when opened
}

// redialEvery is how often a syslog destination that does not answer is
// dialled again.
const redialEvery = time.Second

func (d *syslogDest) String() string {
	if d.spec.Kind == DestSyslogUnix {
		return "syslog+unix://" + d.spec.Path
	}
	if d.spec.Kind == DestSyslogTCP {
		return "syslog+tcp://" + d.spec.Addr
	}
	return "syslog://" + d.spec.Addr
}

func (d *syslogDest) dial() error {
	var c net.Conn
	var err error
	switch d.spec.Kind {
	case DestSyslogUDP:
		c, err = net.Dial("udp", d.spec.Addr)
	case DestSyslogTCP:
		c, err = net.DialTimeout("tcp", d.spec.Addr, d.timeout)
		d.stream = true
	case DestSyslogUnix:
		c, err = net.Dial("unixgram", d.spec.Path)
		d.stream = false
		if err != nil {
			var err2 error
			if c, err2 = net.Dial("unix", d.spec.Path); err2 == nil {
				err, d.stream = nil, true
			}
		}
	}
	if err != nil {
		d.lastDial = d.now()
		return fmt.Errorf("dial: %w", err)
	}
	d.conn = c
	return nil
}

// header appends "<PRI>1 TIMESTAMP HOST APP PROCID MSGID - ".
func (d *syslogDest) header(b []byte, p Proto, t time.Time) []byte {
	b = append(b, '<')
	b = strconv.AppendInt(b, int64(d.spec.Facility*8+6), 10) // severity informational
	b = append(b, ">1 "...)
	b = t.UTC().AppendFormat(b, "2006-01-02T15:04:05.000000Z")
	b = append(b, ' ')
	b = append(b, d.host...)
	b = append(b, ' ')
	b = append(b, d.app...)
	b = append(b, ' ')
	b = append(b, d.pid...)
	b = append(b, ' ')
	b = append(b, p.String()...)
	b = append(b, " - "...)
	return b
}

func (d *syslogDest) add(line []byte, p Proto, t time.Time) error {
	if d.conn == nil {
		d.q.acc.lost[p].Add(1)
		return nil
	}
	d.msg = d.header(d.msg[:0], p, t)
	d.msg = append(d.msg, line...)
	if !d.stream {
		d.conn.SetWriteDeadline(time.Now().Add(d.timeout))
		if _, err := d.conn.Write(d.msg); err != nil {
			d.q.acc.lost[p].Add(1)
			if d.spec.Kind == DestSyslogUnix {
				// A unix socket that refuses is gone (the syslog
				// daemon restarted): dial its new one.
				d.conn.Close()
				d.conn = nil
			}
			return err
		}
		d.q.acc.written[p].Add(1)
		return nil
	}
	d.q.buf = strconv.AppendInt(d.q.buf, int64(len(d.msg)), 10)
	d.q.buf = append(d.q.buf, ' ')
	d.q.buf = append(d.q.buf, d.msg...)
	d.q.mark(p)
	if len(d.q.buf) >= maxBuffer {
		return d.flush()
	}
	return nil
}

func (d *syslogDest) flush() error {
	if d.conn == nil {
		d.q.drop()
		if !d.lastDial.IsZero() && d.now().Sub(d.lastDial) < redialEvery {
			return nil
		}
		return d.dial()
	}
	if len(d.q.buf) == 0 {
		return nil
	}
	if peerGone(d.conn) {
		// The receiver closed the connection (stopped, restarted): a
		// write would still be taken by the kernel and the lines lost
		// unseen. Dial again; lines are lost, and counted, until it
		// answers.
		d.conn.Close()
		d.conn = nil
		if err := d.dial(); err != nil {
			d.q.drop()
			return err
		}
	}
	d.conn.SetWriteDeadline(time.Now().Add(d.timeout))
	if _, err := d.q.write(d.conn); err != nil {
		// The receiver may hold a cut message: a new connection
		// starts afresh.
		d.conn.Close()
		d.conn = nil
		return err
	}
	return nil
}

func (d *syslogDest) reopen() error {
	if !d.stream && d.conn != nil {
		return nil // a datagram socket has nothing to reconnect
	}
	var err error
	if d.conn != nil {
		err = d.flush()
		if d.conn != nil {
			d.conn.Close()
			d.conn = nil
		}
	}
	if derr := d.dial(); derr != nil {
		return derr
	}
	return err
}

func (d *syslogDest) close() error {
	err := d.flush()
	if d.conn != nil {
		d.conn.Close()
		d.conn = nil
	}
	return err
}
