package accesslog

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// failWriter takes the first take[i] bytes of its i-th write and fails
// it with err[i] (nil: takes everything); past the script it takes all.
type failWriter struct {
	out  bytes.Buffer
	take []int
	err  []error
	n    int
}

func (w *failWriter) Write(b []byte) (int, error) {
	i := w.n
	w.n++
	if i >= len(w.take) || w.take[i] < 0 {
		return w.out.Write(b)
	}
	n := min(w.take[i], len(b))
	w.out.Write(b[:n])
	return n, w.err[i]
}

var errDiskFull = errors.New("no space left on device")

// TestFileDestCountsLostLines: a line counts as written only when the
// file took it whole; a failed or short write counts every line it did
// not finish as lost (per line, per protocol), and when it stopped
// inside a line the next write starts with a newline, so only that line
// is damaged and the next starts a line of its own.
func TestFileDestCountsLostLines(t *testing.T) {
	type line struct {
		s string
		p Proto
	}
	first := []line{{"aaaa", HTTP}, {"bbbb", SIP}, {"cccc", HTTP}}
	second := []line{{"dddd", SIP}}
	for _, tc := range []struct {
		name          string
		take          []int
		err           []error
		want          string
		written, lost [2]uint64 // per protocol, after both flushes
		errs          int       // flushes that failed
	}{
		{"all written", nil, nil, "aaaa\nbbbb\ncccc\ndddd\n", [2]uint64{2, 2}, [2]uint64{0, 0}, 0},
		{"disk full, nothing taken", []int{0}, []error{errDiskFull}, "dddd\n", [2]uint64{0, 1}, [2]uint64{2, 1}, 1},
		{"cut inside the second line", []int{7}, []error{errDiskFull}, "aaaa\nbb\ndddd\n", [2]uint64{1, 1}, [2]uint64{1, 1}, 1},
		{"cut at a line's end", []int{5}, []error{errDiskFull}, "aaaa\ndddd\n", [2]uint64{1, 1}, [2]uint64{1, 1}, 1},
		{"short write without error", []int{12}, []error{nil}, "aaaa\nbbbb\ncc\ndddd\n", [2]uint64{1, 2}, [2]uint64{1, 0}, 1},
		{"both fail, the second takes nothing", []int{2, 0}, []error{errDiskFull, errDiskFull}, "aa", [2]uint64{0, 0}, [2]uint64{2, 2}, 2},
		{"both fail, the second ends the cut line", []int{2, 1}, []error{errDiskFull, errDiskFull}, "aa\n", [2]uint64{0, 0}, [2]uint64{2, 2}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var acc accounts
			w := &failWriter{take: tc.take, err: tc.err}
			d := &fileDest{path: "test", w: w, q: pending{acc: &acc}}
			errs := 0
			for _, batch := range [][]line{first, second} {
				for _, l := range batch {
					if err := d.add([]byte(l.s), l.p, t0); err != nil {
						t.Fatal(err)
					}
				}
				if err := d.flush(); err != nil {
					errs++
				}
			}
			got := [2][2]uint64{{acc.written[HTTP].Load(), acc.written[SIP].Load()}, {acc.lost[HTTP].Load(), acc.lost[SIP].Load()}}
			if w.out.String() != tc.want || got != [2][2]uint64{tc.written, tc.lost} || errs != tc.errs {
				t.Errorf("file %q, written %v lost %v, %d failed flushes; want %q, %v, %v, %d", w.out.String(), got[0], got[1], errs, tc.want, tc.written, tc.lost, tc.errs)
			}
		})
	}
}

// syncBuffer is a bytes.Buffer safe for a writer goroutine and the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// TestWarnRateLimited: a failing destination is reported at once, then
// at most once per WarnEvery, with the failures since the last report.
func TestWarnRateLimited(t *testing.T) {
	var out bytes.Buffer
	now := t0
	w := warner{log: slog.New(slog.NewTextHandler(&out, nil)), now: func() time.Time { return now }, dest: "/var/log/sluice/access.log"}
	for _, step := range []time.Duration{0, time.Second, 5 * time.Second, 9 * time.Second, 10 * time.Second, 15 * time.Second, 25 * time.Second} {
		now = t0.Add(step)
		w.warn("write", errDiskFull)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	want := []string{"failures=1", "failures=4", "failures=2"}
	if len(lines) != len(want) {
		t.Fatalf("%d lines, want %d:\n%s", len(lines), len(want), out.String())
	}
	for i, l := range lines {
		for _, s := range []string{"level=WARN", "dest=/var/log/sluice/access.log", "op=write", `err="no space left on device"`, want[i]} {
			if !strings.Contains(l, s) {
				t.Errorf("line %d %q: no %q", i, l, s)
			}
		}
	}
}

// TestFailedReopenWarns: a reopen that fails (the directory renamed away
// under sluice) is counted and logged, naming the destination and the
// error; the lines go on to the file still open.
func TestFailedReopenWarns(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "rd")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	var out syncBuffer
	path := filepath.Join(dir, "a.log")
	l, err := New(Options{Dest: path, Sample: DefaultSample, Log: slog.New(slog.NewTextHandler(&out, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(dir, dir+".old"); err != nil {
		t.Fatal(err)
	}
	l.Reopen()
	l.LogHTTP(rec(1, nil))
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	st := l.Stats()
	if st.WriteErrors != 1 || st.Written[HTTP] != 1 || !strings.Contains(out.String(), "level=WARN") ||
		!strings.Contains(out.String(), "dest="+path) || !strings.Contains(out.String(), "op=reopen") || !strings.Contains(out.String(), "no such file or directory") {
		t.Errorf("stats %+v, log %q: want the failed reopen counted and logged", st, out.String())
	}
	if ids := idsIn(t, filepath.Join(dir+".old", "a.log")); ids["1"] != 1 {
		t.Errorf("the old file holds %v, want the line", ids)
	}
}

// TestSyslogTCPDownAtStart: a syslog receiver that refuses at start-up
// does not stop it: New warns, every line meanwhile is counted lost (not
// written), and once the receiver listens the lines reach it.
func TestSyslogTCPDownAtStart(t *testing.T) {
	port := freePort(t)
	addr := net.JoinHostPort("127.0.0.1", itoa(port))
	var out syncBuffer
	var mu sync.Mutex
	now := t0
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	l, err := New(Options{Dest: "syslog+tcp://" + addr, Sample: DefaultSample, Log: slog.New(slog.NewTextHandler(&out, nil)), Now: clock})
	if err != nil {
		t.Fatalf("New with the receiver down: %v", err)
	}
	defer l.Close()
	if !strings.Contains(out.String(), "dest=syslog+tcp://"+addr) || !strings.Contains(out.String(), "refused") {
		t.Errorf("log %q: want a warning naming the destination and the refusal", out.String())
	}
	for i := range 3 {
		l.LogSIP(&SIPRecord{Start: t0, Method: "INVITE", CSeq: uint32(i)})
	}
	for deadline := time.Now().Add(10 * time.Second); l.Stats().Lost[SIP] < 3; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("stats %+v: want 3 SIP lines lost", l.Stats())
		}
	}
	if st := l.Stats(); st.Written[SIP] != 0 {
		t.Errorf("stats %+v: lines counted written with the receiver down", st)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("port %d taken meanwhile: %v", port, err)
	}
	defer ln.Close()
	mu.Lock()
	now = now.Add(2 * redialEvery)
	mu.Unlock()
	got := make(chan string, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- ""
			return
		}
		defer c.Close()
		b, _ := io.ReadAll(c)
		got <- string(b)
	}()
	// Lines until one is written: the first after the redial may still
	// find no connection.
	for i := 0; l.Stats().Written[SIP] == 0; i++ {
		l.LogSIP(&SIPRecord{Start: t0, Method: "BYE"})
		time.Sleep(5 * time.Millisecond)
		if i > 2000 {
			t.Fatalf("stats %+v: nothing written once the receiver listens", l.Stats())
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	st := l.Stats()
	msgs := strings.Count(<-got, " sip - ")
	if uint64(msgs) != st.Written[SIP] || st.Written[SIP]+st.Lost[SIP] != st.Logged[SIP] {
		t.Errorf("%d messages received; stats %+v: want received = written, written + lost = logged", msgs, st)
	}
}

func itoa(n int) string { return string(appendInt(nil, n)) }

func appendInt(b []byte, n int) []byte {
	if n >= 10 {
		b = appendInt(b, n/10)
	}
	return append(b, byte('0'+n%10))
}

// blockedFIFO is a FIFO with a reader that never reads, filled to the
// brim: the next write to it blocks.
func blockedFIFO(t *testing.T) string {
	t.Helper()
	fifo := filepath.Join(t.TempDir(), "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	rd, err := os.OpenFile(fifo, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rd.Close() })
	wr, err := syscall.Open(fifo, syscall.O_WRONLY|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(wr)
	fill := bytes.Repeat([]byte("x"), 4096)
	for {
		if _, err := syscall.Write(wr, fill); err != nil {
			if err != syscall.EAGAIN {
				t.Fatal(err)
			}
			return fifo
		}
	}
}

// TestBlockedDestinationStopsOnlyItsOwn: HTTP lines to a pipe nobody
// reads block the HTTP writer; the SIP lines to their own file are
// written all the same.
func TestBlockedDestinationStopsOnlyItsOwn(t *testing.T) {
	fifo := blockedFIFO(t)
	defer func(d time.Duration) { closeTimeout = d }(closeTimeout)
	closeTimeout = 50 * time.Millisecond
	sipLog := filepath.Join(t.TempDir(), "sip.log")
	l, err := New(Options{HTTPDest: fifo, SIPDest: sipLog, Sample: DefaultSample, RingSize: 16})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 100 {
		l.LogHTTP(rec(i, nil))
	}
	for i := range 3 {
		l.LogSIP(&SIPRecord{Start: t0, Method: "INVITE", CSeq: uint32(i)})
	}
	for deadline := time.Now().Add(10 * time.Second); l.Stats().Written[SIP] < 3; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("stats %+v: the SIP lines wait behind the blocked HTTP destination", l.Stats())
		}
	}
	err = l.Close()
	if err == nil || !strings.Contains(err.Error(), fifo) {
		t.Errorf("Close: %v, want the blocked destination named", err)
	}
	b, _ := os.ReadFile(sipLog)
	if n := strings.Count(string(b), "\n"); n != 3 {
		t.Errorf("%d SIP lines in the file, want 3", n)
	}
}

// TestPipeWriteDeadline: a pipe nobody reads costs its lines (counted
// lost) after writeTimeout instead of holding the writer for good.
func TestPipeWriteDeadline(t *testing.T) {
	fifo := blockedFIFO(t)
	defer func(d time.Duration) { writeTimeout = d }(writeTimeout)
	writeTimeout = 20 * time.Millisecond
	var out syncBuffer
	l, err := New(Options{Dest: fifo, Sample: DefaultSample, Log: slog.New(slog.NewTextHandler(&out, nil))})
	if err != nil {
		t.Fatal(err)
	}
	l.LogHTTP(rec(1, nil))
	for deadline := time.Now().Add(10 * time.Second); l.Stats().Lost[HTTP] < 1; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("stats %+v: the line to the blocked pipe is not counted lost", l.Stats())
		}
	}
	if err := l.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if st := l.Stats(); st.Written[HTTP] != 0 || st.WriteErrors == 0 || !strings.Contains(out.String(), "timeout") {
		t.Errorf("stats %+v, log %q", st, out.String())
	}
}

// TestSyslogTCPReceiverStops: lines sent while the syslog receiver is
// down (it closed the connection and listens no more) are counted lost,
// not written.
func TestSyslogTCPReceiverStops(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			accepted <- c
		}
	}()
	l, err := New(Options{Dest: "syslog+tcp://" + ln.Addr().String(), Sample: DefaultSample, Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c := <-accepted
	l.LogSIP(&SIPRecord{Start: t0, Method: "INVITE"})
	for deadline := time.Now().Add(10 * time.Second); l.Stats().Written[SIP] < 1; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("stats %+v: the first line not written", l.Stats())
		}
	}
	// The receiver reads what it got, then stops: it closes the
	// connection (a FIN: nothing unread) and the listener.
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	var got []byte
	for buf := make([]byte, 4096); !bytes.Contains(got, []byte("INVITE")); {
		n, err := c.Read(buf)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, buf[:n]...)
	}
	c.Close()
	ln.Close()
	for i := range 6 {
		l.LogSIP(&SIPRecord{Start: t0, Method: "BYE", CSeq: uint32(i)})
	}
	for deadline := time.Now().Add(10 * time.Second); l.Stats().Lost[SIP] < 6; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("stats %+v: want the 6 lines sent while the receiver is down lost", l.Stats())
		}
	}
	if st := l.Stats(); st.Written[SIP] != 1 || st.Lost[SIP] != 6 {
		t.Errorf("stats %+v: want 1 written, 6 lost", st)
	}
}
