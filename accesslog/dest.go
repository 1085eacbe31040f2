package accesslog

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
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
	if f := u.Query().Get("facility"); f != "" {
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

// dest is where the writer puts lines. add frames and buffers one line
// (a stream) or sends it (a datagram); flush writes what is buffered.
// Only the writer goroutine calls them, except close after the writer
// ended.
type dest interface {
	add(line []byte, p Proto, t time.Time) error
	flush() error
	reopen() error
	close() error
}

func openDest(spec DestSpec, o *Options) (dest, error) {
	switch spec.Kind {
	case DestStdout:
		return &fileDest{f: os.Stdout, stdout: true}, nil
	case DestFile:
		d := &fileDest{path: spec.Path}
		if err := d.reopen(); err != nil {
			return nil, err
		}
		return d, nil
	default:
		d := &syslogDest{spec: spec, app: o.AppName, host: o.Hostname, pid: strconv.Itoa(os.Getpid())}
		if d.host == "" {
			d.host, _ = os.Hostname()
		}
		d.host = syslogToken(d.host)
		d.app = syslogToken(d.app)
		if err := d.dial(); err != nil {
			return nil, err
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

// fileDest is stdout or a file opened for appending. O_APPEND makes it
// safe under logrotate's copytruncate: after the copy truncates the file,
// the next write lands at its new end, not at the old offset (no hole of
// zeros). reopen opens the path again (after a rename: SIGUSR1).
type fileDest struct {
	path   string
	f      *os.File
	stdout bool
	buf    []byte
}

func (d *fileDest) add(line []byte, _ Proto, _ time.Time) error {
	d.buf = append(d.buf, line...)
	d.buf = append(d.buf, '\n')
	if len(d.buf) >= maxBuffer {
		return d.flush()
	}
	return nil
}

func (d *fileDest) flush() error {
	if len(d.buf) == 0 || d.f == nil {
		d.buf = d.buf[:0]
		return nil
	}
	_, err := d.f.Write(d.buf)
	d.buf = d.buf[:0]
	return err
}

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
	if d.f != nil {
		d.flush()
		d.f.Close()
	}
	d.f = f
	return nil
}

func (d *fileDest) close() error {
	err := d.flush()
	if d.f != nil && !d.stdout {
		if cerr := d.f.Close(); err == nil {
			err = cerr
		}
		d.f = nil
	}
	return err
}

// syslogDest sends RFC 5424 messages: one datagram per line over UDP and
// a unix datagram socket, octet-counted framing (RFC 6587 3.4.1) over TCP
// and a unix stream socket. A stream that breaks is dialled again at the
// next flush; lines meanwhile are lost and counted.
type syslogDest struct {
	spec      DestSpec
	app, host string
	pid       string
	conn      net.Conn
	stream    bool
	buf, msg  []byte
}

// writeTimeout bounds a syslog write, so Close ends even when the
// receiver stopped reading.
const writeTimeout = 5 * time.Second

func (d *syslogDest) dial() error {
	var c net.Conn
	var err error
	switch d.spec.Kind {
	case DestSyslogUDP:
		c, err = net.Dial("udp", d.spec.Addr)
	case DestSyslogTCP:
		c, err = net.DialTimeout("tcp", d.spec.Addr, writeTimeout)
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
		return errNotConnected
	}
	if !d.stream {
		d.msg = d.header(d.msg[:0], p, t)
		d.msg = append(d.msg, line...)
		d.conn.SetWriteDeadline(time.Now().Add(writeTimeout))
		_, err := d.conn.Write(d.msg)
		return err
	}
	d.msg = d.header(d.msg[:0], p, t)
	d.msg = append(d.msg, line...)
	d.buf = strconv.AppendInt(d.buf, int64(len(d.msg)), 10)
	d.buf = append(d.buf, ' ')
	d.buf = append(d.buf, d.msg...)
	if len(d.buf) >= maxBuffer {
		return d.flush()
	}
	return nil
}

var errNotConnected = errors.New("syslog: not connected")

func (d *syslogDest) flush() error {
	if d.conn == nil {
		d.buf = d.buf[:0]
		if err := d.dial(); err != nil {
			return err
		}
		return nil
	}
	if len(d.buf) == 0 {
		return nil
	}
	d.conn.SetWriteDeadline(time.Now().Add(writeTimeout))
	_, err := d.conn.Write(d.buf)
	d.buf = d.buf[:0]
	if err != nil && d.stream {
		d.conn.Close()
		d.conn = nil
	}
	return err
}

func (d *syslogDest) reopen() error {
	if !d.stream {
		return nil
	}
	d.flush()
	if d.conn != nil {
		d.conn.Close()
		d.conn = nil
	}
	return d.dial()
}

func (d *syslogDest) close() error {
	err := d.flush()
	if d.conn != nil {
		d.conn.Close()
		d.conn = nil
	}
	return err
}
