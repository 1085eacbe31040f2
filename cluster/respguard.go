package cluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"syscall"
)

// Whatever answers at the Redis address is not trusted with the node's
// memory. go-redis allocates what a reply's header announces (a bulk
// string's length, an aggregate's element count) before a byte of it
// arrives, without a bound: one line such as "*9223372036854775807"
// panics the goroutine reading it (makeslice: len out of range) and ends
// the balancer, SIP and HTTP with it, and "$1073741823" makes it allocate
// a GiB per connection. A hostile or compromised Redis, anyone on the path
// of a plain redis:// connection, or a local user who binds the port while
// Redis is down can send them. Every connection go-redis dials is wrapped
// in respGuard, which reads the reply stream as it passes and fails the
// read of a header or line over these bounds: go-redis closes that connection and
// reports an error, which the cluster handles as Redis unreachable (the
// fail policy).
const (
	// maxRESPBulk bounds a bulk string, blob error or verbatim string.
	// The largest value the cluster reads is a signed dialog change
	// (maxDialogMessage); a learned MOP state is at most maxMOPState.
	maxRESPBulk = 1 << 20
	// maxRESPElems bounds an aggregate's element count; the cluster's
	// scripts answer a few numbers.
	maxRESPElems = 1 << 16
	// maxRESPLine bounds a line (a status, an error, a number): go-redis
	// reads one longer than its buffer with bufio.ReadBytes, unbounded.
	maxRESPLine = 64 << 10
)

// errRESPBound is the read error of a reply whose header is over the
// bounds or malformed.
var errRESPBound = errors.New("redis reply refused: a length over the cluster's bounds or malformed")

// guardDialer wraps each connection dial makes in a respGuard.
func guardDialer(dial func(ctx context.Context, network, addr string) (net.Conn, error)) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		if sc, ok := c.(syscall.Conn); ok {
			return &respGuardSys{respGuard: respGuard{Conn: c}, sc: sc}, nil
		}
		return &respGuard{Conn: c}, nil
	}
}

// respGuardSys is the respGuard of a plain TCP connection: go-redis's
// health check of an idle pooled connection peeks at its socket
// (syscall.Conn), which finds a connection Redis closed before it is
// used, as without the guard; a peek consumes nothing the scan has not
// seen. A TLS connection has no such socket, with or without the guard.
type respGuardSys struct {
	respGuard
	sc syscall.Conn
}

func (g *respGuardSys) SyscallConn() (syscall.RawConn, error) { return g.sc.SyscallConn() }

// respGuard is a connection to Redis whose replies are checked (respScan)
// before go-redis reads them.
type respGuard struct {
	net.Conn
	scan respScan
}

// Read fails, and goes on failing, from the first header over the
// bounds; go-redis then closes the connection.
func (g *respGuard) Read(p []byte) (int, error) {
	if g.scan.err != nil {
		return 0, g.scan.err
	}
	n, err := g.Conn.Read(p)
	if n > 0 {
		if serr := g.scan.feed(p[:n]); serr != nil {
			return 0, serr
		}
	}
	return n, err
}

// respScan follows a RESP2/RESP3 reply stream byte by byte: the type byte
// of each line, the length on the lines that announce one, and the
// payload of bulk strings, which it skips (their bytes may look like
// anything).
type respScan struct {
	skip    int64 // bytes of a bulk payload and its CRLF still to come
	inLine  bool  // after a line's type byte, before its LF
	counted bool  // the line announces a length: bulk or aggregate
	bulk    bool  // the length is a payload's ($ ! =)
	neg     bool
	digits  int
	n       int64
	line    int // bytes of the line so far
	err     error
}

// feed scans p; once it has failed it fails every call.
func (s *respScan) feed(p []byte) error {
	if s.err != nil {
		return s.err
	}
	for i := 0; i < len(p); {
		if s.skip > 0 {
			k := min(int64(len(p)-i), s.skip)
			i += int(k)
			s.skip -= k
			continue
		}
		c := p[i]
		i++
		if !s.inLine {
			s.inLine, s.neg, s.digits, s.n, s.line = true, false, 0, 0, 1
			switch c {
			case '$', '!', '=':
				s.counted, s.bulk = true, true
			case '*', '%', '~', '>', '|':
				s.counted, s.bulk = true, false
			default:
				s.counted, s.bulk = false, false
			}
			continue
		}
		if c == '\n' {
			s.inLine = false
			if s.counted {
				if err := s.end(); err != nil {
					s.err = err
					return err
				}
			}
			continue
		}
		if s.line++; s.line > maxRESPLine {
			s.err = fmt.Errorf("%w (a line over %d bytes)", errRESPBound, maxRESPLine)
			return s.err
		}
		if !s.counted || c == '\r' {
			continue
		}
		switch {
		case c == '-' && s.digits == 0 && !s.neg:
			s.neg = true
		case c >= '0' && c <= '9':
			s.n = s.n*10 + int64(c-'0')
			s.digits++
			if s.n > max(maxRESPBulk, maxRESPElems) {
				s.err = fmt.Errorf("%w (a length over %d)", errRESPBound, max(maxRESPBulk, maxRESPElems))
				return s.err
			}
		default:
			s.err = fmt.Errorf("%w (byte %q in a length)", errRESPBound, c)
			return s.err
		}
	}
	return nil
}

// end checks a length line just read and, for a bulk payload, arranges
// to skip it.
func (s *respScan) end() error {
	switch {
	case s.digits == 0:
		return fmt.Errorf("%w (a length line without a number)", errRESPBound)
	case s.neg:
		if s.n != 1 {
			return fmt.Errorf("%w (length -%d)", errRESPBound, s.n)
		}
		return nil // a RESP2 null
	case s.bulk && s.n > maxRESPBulk:
		return fmt.Errorf("%w (a bulk string of %d bytes; at most %d)", errRESPBound, s.n, maxRESPBulk)
	case !s.bulk && s.n > maxRESPElems:
		return fmt.Errorf("%w (an aggregate of %d elements; at most %d)", errRESPBound, s.n, maxRESPElems)
	}
	if s.bulk {
		s.skip = s.n + 2
	}
	return nil
}
