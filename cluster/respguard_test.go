package cluster

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// fakeRedis answers every connection's commands: HELLO with an error (as
// a Redis without RESP3 does), CLIENT with +OK, and any other command
// with answer. It is what a local user who binds the Redis port, or a
// compromised Redis, can say.
func fakeRedis(t *testing.T, answer string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					args, err := readCommand(r)
					if err != nil {
						return
					}
					reply := answer
					switch strings.ToLower(args[0]) {
					case "hello":
						reply = "-ERR unknown command 'HELLO'\r\n"
					case "client":
						reply = "+OK\r\n"
					}
					if _, err := io.WriteString(c, reply); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// readCommand reads one command as clients send them: an array of bulk
// strings.
func readCommand(r *bufio.Reader) ([]string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	n, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, "*")))
	if err != nil || n < 1 || n > 64 {
		return nil, errors.New("not a command")
	}
	args := make([]string, n)
	for i := range args {
		if line, err = r.ReadString('\n'); err != nil {
			return nil, err
		}
		l, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, "$")))
		if err != nil || l < 0 || l > 1<<16 {
			return nil, errors.New("not a bulk string")
		}
		b := make([]byte, l+2)
		if _, err := io.ReadFull(r, b); err != nil {
			return nil, err
		}
		args[i] = string(b[:l])
	}
	return args, nil
}

// TestHostileRedisReplyBomb: a reply whose header announces more than
// anyone can hold fails that command with an error. Before, go-redis
// made the slice or string the header asked for: the process died of
// "makeslice: len out of range" (an aggregate or bulk length near 2^63)
// from one line of whatever answered at the Redis address.
func TestHostileRedisReplyBomb(t *testing.T) {
	for _, c := range []struct {
		name, answer string
	}{
		{"aggregate of 2^63-1", "*9223372036854775807\r\n"},
		{"bulk of 2^63-1", "$9223372036854775807\r\n"},
		{"map of 2^62", "%4611686018427387904\r\n"},
		{"push of 2^63-1", ">9223372036854775807\r\n"},
		{"endless status line", "+" + strings.Repeat("A", 1<<20)},
	} {
		t.Run(c.name, func(t *testing.T) {
			rdb, err := NewClient("redis://"+fakeRedis(t, c.answer)+"/0", time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer rdb.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			err = rdb.Ping(ctx).Err()
			if !errors.Is(err, errRESPBound) {
				t.Fatalf("PING answered %q: error %v, want errRESPBound", c.answer, err)
			}
		})
	}
}

// TestRESPGuardPassesReplies: replies within the bounds reach go-redis
// as they were, a bulk payload that looks like a header included.
func TestRESPGuardPassesReplies(t *testing.T) {
	for _, c := range []struct {
		name, answer, want string
	}{
		{"status", "+PONG\r\n", "PONG"},
		{"bulk", "$5\r\nhello\r\n", "hello"},
		{"bulk holding a header", "$22\r\n*9223372036854775807\r\n\r\n", "*9223372036854775807\r\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			rdb, err := NewClient("redis://"+fakeRedis(t, c.answer)+"/0", time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer rdb.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			got, err := rdb.Echo(ctx, "x").Result()
			if err != nil || got != c.want {
				t.Fatalf("ECHO answered %q: %q, %v; want %q", c.answer, got, err, c.want)
			}
		})
	}
}

// TestRESPScan: golden vectors of the reply scanner, fed whole and one
// byte at a time (a reply split across reads anywhere).
func TestRESPScan(t *testing.T) {
	for _, c := range []struct {
		name, in string
		ok       bool
	}{
		{"status, error, integer", "+OK\r\n-ERR x\r\n:123\r\n", true},
		{"null bulk and array", "$-1\r\n*-1\r\n", true},
		{"array of bulks", "*2\r\n$3\r\nfoo\r\n$0\r\n\r\n", true},
		{"bulk at the bound", "$1048576\r\n" + strings.Repeat("x", 1<<20) + "\r\n", true},
		{"bulk payload looking like a header", "$5\r\n*9999\r\n:1\r\n", true},
		{"resp3 map, set, double, null, bool", "%1\r\n+a\r\n:1\r\n~1\r\n,1.5\r\n_\r\n#t\r\n", true},
		{"aggregate at the bound", "*65536\r\n", true},
		{"bulk over the bound", "$1048577\r\n", false},
		{"aggregate over the bound", "*65537\r\n", false},
		{"blob error of 1 GiB", "!1073741824\r\n", false},
		{"verbatim over the bound", "=2000000\r\n", false},
		{"length near 2^63", "*9223372036854775807\r\n", false},
		{"negative length", "*-2\r\n", false},
		{"length not a number", "$abc\r\n", false},
		{"length missing", "*\r\n", false},
		{"streamed string", "$?\r\n", false},
		{"status line at the bound", "+" + strings.Repeat("x", maxRESPLine-3) + "\r\n", true},
		{"status line over the bound", "+" + strings.Repeat("x", maxRESPLine) + "\r\n", false},
		{"error line without an end", "-" + strings.Repeat("E", 1<<20), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			var whole respScan
			errWhole := whole.feed([]byte(c.in))
			var bytewise respScan
			var errBytes error
			for i := 0; i < len(c.in) && errBytes == nil; i++ {
				errBytes = bytewise.feed([]byte{c.in[i]})
			}
			for _, err := range []error{errWhole, errBytes} {
				if (err == nil) != c.ok {
					t.Fatalf("%q: error %v, want ok=%v", c.in, err, c.ok)
				}
				if err != nil && !errors.Is(err, errRESPBound) {
					t.Fatalf("%q: error %v, want errRESPBound", c.in, err)
				}
			}
		})
	}
}

// TestRESPGuardKeepsHealthCheck: a guarded plain TCP connection still
// offers its socket to go-redis's health check of idle pooled
// connections (syscall.Conn), so one Redis closed is found before use.
func TestRESPGuardKeepsHealthCheck(t *testing.T) {
	addr := fakeRedis(t, "+PONG\r\n")
	dial := guardDialer((&net.Dialer{}).DialContext)
	c, err := dial(context.Background(), "tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sc, ok := c.(syscall.Conn)
	if !ok {
		t.Fatal("a guarded TCP connection does not offer its socket: go-redis no longer checks idle connections")
	}
	if _, err := sc.SyscallConn(); err != nil {
		t.Fatal(err)
	}
}
