package accesslog

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sluicelb/sluice/internal/testenv"
)

func rec(i int, id []byte) *HTTPRecord {
	id = strconv.AppendInt(id[:0], int64(i), 10)
	return &HTTPRecord{
		Start: t0, Client: netip.MustParseAddrPort("192.0.2.1:1000"), Method: []byte("GET"),
		Host: []byte("h"), Path: []byte("/p"), Proto: "HTTP/1.1", Status: 200, RequestID: id,
	}
}

// idsIn reads the request_id of every JSON line in the files.
func idsIn(t *testing.T, files ...string) map[string]int {
	t.Helper()
	ids := map[string]int{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(strings.TrimSuffix(string(b), "\n"), "\n") {
			if line == "" {
				continue
			}
			_, rest, ok := strings.Cut(line, `"request_id":"`)
			id, _, ok2 := strings.Cut(rest, `"`)
			if !ok || !ok2 {
				t.Fatalf("%s: a line without request_id: %q", f, line)
			}
			ids[id]++
		}
	}
	return ids
}

// TestLogrotateRenameReopen: records logged from several goroutines while
// the file is renamed and Reopen called (what logrotate's postrotate
// SIGUSR1 does) five times; every logged record is in exactly one of the
// files, none twice.
func TestLogrotateRenameReopen(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "access.log")
	l, err := New(Options{Dest: path, Sample: DefaultSample, RingSize: 1 << 16})
	if err != nil {
		t.Fatal(err)
	}
	const producers, each = 4, 5000
	var wg sync.WaitGroup
	for g := range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var id []byte
			for i := range each {
				l.LogHTTP(rec(g*each+i, id))
			}
		}()
	}
	files := []string{path}
	for k := range 5 {
		rotated := fmt.Sprintf("%s.%d", path, k)
		if err := os.Rename(path, rotated); err != nil {
			t.Fatal(err)
		}
		files = append(files, rotated)
		l.Reopen()
		// logrotate's next rotation comes after sluice opened the new file.
		for {
			if _, err := os.Stat(path); err == nil {
				break
			}
			time.Sleep(time.Millisecond)
		}
	}
	wg.Wait()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	st := l.Stats()
	ids := idsIn(t, files...)
	for id, n := range ids {
		if n != 1 {
			t.Errorf("request %s written %d times", id, n)
		}
	}
	if uint64(len(ids)) != st.Logged[HTTP] || st.Logged[HTTP]+st.Dropped[HTTP] != producers*each || st.Written[HTTP] != st.Logged[HTTP] {
		t.Errorf("%d distinct lines in the files; stats %+v; want logged = written = lines, logged + dropped = %d", len(ids), st, producers*each)
	}
	if st.Dropped[HTTP] != 0 {
		t.Errorf("%d dropped with a ring larger than the load", st.Dropped[HTTP])
	}
}

// TestDropsWhenDestinationBlocks: a FIFO nobody reads fills, the writer
// blocks in write, the ring fills and LogHTTP drops and counts without
// blocking; once read, every record that was taken is written.
func TestDropsWhenDestinationBlocks(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	rd, err := os.OpenFile(fifo, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	// The writer stays blocked until the drain below starts; on a loaded
	// machine that can take longer than writeTimeout, whose give-up (a
	// write error, records lost) is another test's subject.
	defer func(d time.Duration) { writeTimeout = d }(writeTimeout)
	writeTimeout = 10 * time.Minute
	l, err := New(Options{Dest: fifo, Sample: DefaultSample, RingSize: 16})
	if err != nil {
		t.Fatal(err)
	}
	const n = 20000 // ~6 MB of lines: far beyond a pipe's 64 KiB and the ring
	var id []byte
	for i := range n {
		l.LogHTTP(rec(i, id))
	}
	st := l.Stats()
	if st.Dropped[HTTP] == 0 || st.Logged[HTTP]+st.Dropped[HTTP] != n {
		t.Fatalf("stats %+v: want drops, logged + dropped = %d", st, n)
	}
	// Drain the pipe (blocking reads now) and close.
	syscall.SetNonblock(int(rd.Fd()), false)
	lines := make(chan int)
	go func() {
		c := 0
		sc := bufio.NewScanner(rd)
		sc.Buffer(make([]byte, 1<<16), 1<<16)
		for sc.Scan() {
			c++
		}
		lines <- c
	}()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	got := <-lines
	st = l.Stats()
	if uint64(got) != st.Logged[HTTP] || st.Written[HTTP] != st.Logged[HTTP] {
		t.Errorf("%d lines read; stats %+v: want every logged record written once", got, st)
	}
}

func TestLogHTTPAllocatesNothing(t *testing.T) {
	if raceOn {
		t.Skip("the race detector allocates; run without -race")
	}
	l, err := New(Options{Dest: filepath.Join(t.TempDir(), "a.log"), Sample: DefaultSample, RingSize: 1 << 12})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	r := rec(1, nil)
	if a := testing.AllocsPerRun(1000, func() { l.LogHTTP(r) }); a != 0 {
		t.Errorf("LogHTTP: %v allocations, want 0", a)
	}
	var nilL *Logger
	nilL.LogHTTP(r) // a nil logger takes nothing
}

func BenchmarkLogHTTP(b *testing.B) {
	l, err := New(Options{Dest: filepath.Join(b.TempDir(), "a.log"), Sample: DefaultSample})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	r := rec(1, nil)
	b.ReportAllocs()
	for b.Loop() {
		l.LogHTTP(r)
	}
}

func BenchmarkFormatJSON(b *testing.B) {
	l := &Logger{opts: Options{Format: JSON}}
	r := httpOutcomes()[0].r
	var buf []byte
	b.ReportAllocs()
	for b.Loop() {
		buf = l.formatHTTP(buf[:0], &r)
	}
}

// freePort is a port for a server the test starts: below the ephemeral
// range, see testenv.FreePort.
func freePort(t *testing.T) int { return testenv.FreePortNum(t) }

// TestRsyslogReceives: a real rsyslogd on loopback (UDP and TCP inputs)
// writes what it receives to a file; every record sent over TCP
// (octet-counted) and over UDP arrives, RFC 5424 parsed by rsyslog
// (APP-NAME, MSGID and the message as sent).
func TestRsyslogReceives(t *testing.T) {
	bin := testenv.Tool(t, "rsyslogd", "rsyslog")
	dir := t.TempDir()
	port := freePort(t)
	out := filepath.Join(dir, "out.log")
	conf := fmt.Sprintf(`global(workDirectory=%q)
module(load="imtcp")
module(load="imudp")
input(type="imtcp" address="127.0.0.1" port="%d")
input(type="imudp" address="127.0.0.1" port="%d" rcvbufSize="4m")
template(name="t" type="string" string="%%app-name%% %%msgid%% %%msg%%\n")
*.* action(type="omfile" file=%q template="t")
`, dir, port, port, out)
	cf := filepath.Join(dir, "rsyslog.conf")
	os.WriteFile(cf, []byte(conf), 0o644)
	cmd := exec.Command(bin, "-n", "-f", cf, "-i", filepath.Join(dir, "pid"))
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("rsyslogd does not listen on %d: %v", port, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	const n = 200
	for _, scheme := range []string{"syslog+tcp", "syslog+udp"} {
		l, err := New(Options{Dest: fmt.Sprintf("%s://127.0.0.1:%d", scheme, port), Sample: DefaultSample, AppName: "sluice-" + scheme[7:], Format: Logfmt})
		if err != nil {
			t.Fatal(err)
		}
		var id []byte
		for i := range n {
			l.LogHTTP(rec(i, id))
			if scheme == "syslog+udp" && i%10 == 9 {
				// Loopback UDP drops what the receiver's socket buffer
				// cannot hold: with the race detector's load on both
				// cores rsyslogd fell behind a burst of 50 and lost the
				// last 32 lines. A 4 MiB buffer and small bursts.
				time.Sleep(2 * time.Millisecond)
			}
		}
		l.LogSIP(&SIPRecord{Start: t0, Method: "INVITE", CallID: "c1", Status: 200})
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
	}
	var got map[string]int
	for time.Now().Before(deadline.Add(10 * time.Second)) {
		got = map[string]int{}
		b, _ := os.ReadFile(out)
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.SplitN(line, " ", 3)
			if len(f) == 3 && strings.HasPrefix(f[0], "sluice-") {
				key := f[0] + " " + f[1]
				if f[1] == "http" {
					if _, after, ok := strings.Cut(f[2], "request_id="); ok {
						id, _, _ := strings.Cut(after, " ")
						key += " " + id
					}
				}
				got[key]++
			}
		}
		if len(got) == 2*(n+1) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, app := range []string{"sluice-tcp", "sluice-udp"} {
		for i := range n {
			if k := fmt.Sprintf("%s http %d", app, i); got[k] != 1 {
				t.Errorf("%q received %d times", k, got[k])
			}
		}
		if got[app+" sip"] != 1 {
			t.Errorf("%s: the SIP line received %d times", app, got[app+" sip"])
		}
	}
}

// waitWritten waits until the writer handed n HTTP lines to the
// destination (delivery only; nothing is asserted on time).
func waitWritten(t *testing.T, l *Logger, n uint64) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); l.Stats().Written[HTTP] < n; {
		if time.Now().After(deadline) {
			t.Fatalf("%d lines written, want %d", l.Stats().Written[HTTP], n)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestCopytruncateSafe: after logrotate's copytruncate the next lines
// start the file again: no hole of zeros where the old offset was.
func TestCopytruncateSafe(t *testing.T) {
	path := filepath.Join(t.TempDir(), "access.log")
	l, err := New(Options{Dest: path, Sample: DefaultSample})
	if err != nil {
		t.Fatal(err)
	}
	var id []byte
	for i := range 100 {
		l.LogHTTP(rec(i, id))
	}
	waitWritten(t, l, 100)
	if err := os.Truncate(path, 0); err != nil {
		t.Fatal(err)
	}
	for i := 100; i < 150; i++ {
		l.LogHTTP(rec(i, id))
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) == 0 || b[0] != '{' || strings.IndexByte(string(b), 0) >= 0 {
		t.Fatalf("after the truncation the file starts %q: want the next line at offset 0", b[:min(len(b), 40)])
	}
	ids := idsIn(t, path)
	if len(ids) != 50 || ids["100"] != 1 || ids["149"] != 1 {
		t.Errorf("%d lines after the truncation, want the 50 logged since", len(ids))
	}
}

// TestSyslogUnixDatagram: syslog+unix:// to a datagram socket (as
// /dev/log is) sends one RFC 5424 message per line (local3: PRI 19*8+6).
func TestSyslogUnixDatagram(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "log")
	pc, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	l, err := New(Options{Dest: "syslog+unix://" + sock + "?facility=local3", Sample: DefaultSample, Hostname: "node 1", Format: Logfmt})
	if err != nil {
		t.Fatal(err)
	}
	l.LogHTTP(rec(7, nil))
	l.LogSIP(&SIPRecord{Start: t0, Method: "INVITE", CallID: "c1", Status: 503, StatusFrom: BySluice})
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	pc.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 4096)
	for _, want := range []string{
		"<158>1 2026-12-01T14:02:03.456789Z node1 sluice " + strconv.Itoa(os.Getpid()) + " http - time=2026-12-01T14:02:03.456Z log=http ",
		"<158>1 2026-12-01T14:02:03.456789Z node1 sluice " + strconv.Itoa(os.Getpid()) + " sip - time=2026-12-01T14:02:03.456Z log=sip kind=transaction method=INVITE ",
	} {
		n, err := pc.Read(buf)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(string(buf[:n]), want) {
			t.Errorf("message %q\nwant prefix %q", buf[:n], want)
		}
	}
}

// TestCloseGivesUpOnBlockedDestination: Close does not hang on a FIFO
// nobody reads; records logged after Close are dropped and counted.
func TestCloseGivesUpOnBlockedDestination(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	rd, err := os.OpenFile(fifo, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	defer func(d time.Duration) { closeTimeout = d }(closeTimeout)
	closeTimeout = 50 * time.Millisecond
	l, err := New(Options{Dest: fifo, Sample: DefaultSample, RingSize: 16})
	if err != nil {
		t.Fatal(err)
	}
	// Fill the FIFO to the brim first: the logger's first write blocks.
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
			break // full
		}
	}
	var id []byte
	// The writer writes it now or at Close, and blocks either way (for
	// writeTimeout, far longer than closeTimeout here).
	l.LogHTTP(rec(1, id))
	if err := l.Close(); err == nil || !strings.Contains(err.Error(), "took nothing") || !strings.Contains(err.Error(), fifo) {
		t.Errorf("Close: %v, want the blocked destination named", err)
	}
	before := l.Stats().Dropped[HTTP]
	l.LogHTTP(rec(1, id))
	if l.Stats().Dropped[HTTP] != before+1 {
		t.Error("a record logged after Close was not counted dropped")
	}
	if err := l.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// TestLongFieldsCut: a hostile path and host cannot crowd the method and
// request id out of the record, and nothing goes past RecordBytes.
func TestLongFieldsCut(t *testing.T) {
	r := rec(1, nil)
	r.Host = bytes.Repeat([]byte("h"), 5000)
	r.Path = bytes.Repeat([]byte("p"), 5000)
	r.UserAgent = []byte("ua")
	var dst HTTPRecord
	arena := copyHTTP(&dst, make([]byte, 0, DefaultRecordBytes), r)
	if string(dst.Method) != "GET" || string(dst.RequestID) != "1" || len(dst.Host) != 128 || len(dst.Path) != DefaultRecordBytes-3-1-128 || len(dst.UserAgent) != 0 || len(arena) != DefaultRecordBytes {
		t.Errorf("method %q id %q host %d path %d ua %q arena %d", dst.Method, dst.RequestID, len(dst.Host), len(dst.Path), dst.UserAgent, len(arena))
	}
}
