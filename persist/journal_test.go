package persist

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestJournalEncoding: golden bytes of a journal message, the round trip,
// the split of a batch over journalMsgMax, and messages cut short.
func TestJournalEncoding(t *testing.T) {
	exp := time.Unix(0, 0x0102030405060708)
	recs := []DialogRecord{
		{Key: 0x1122334455667788, Expires: exp, ToTag: 0xaabbccdd, Src: 0xeeff, Backend: "p\x00s1"},
		{Key: 1, Expires: exp, Linger: true, Backend: ""},
		{Key: 2, Expires: exp, Backend: strings.Repeat("x", maxDialogBackend+1)}, // left out
	}
	msg, rest := appendJournal(nil, recs)
	if len(rest) != 0 {
		t.Fatalf("%d records left", len(rest))
	}
	const golden = "01" +
		"1122334455667788" + "0102030405060708" + "aabbccdd" + "eeff" + "00" + "04" + "70007331" +
		"0000000000000001" + "0102030405060708" + "00000000" + "0000" + "01" + "00"
	if got := hex.EncodeToString(msg); got != golden {
		t.Fatalf("message\n got %s\nwant %s", got, golden)
	}
	back, err := decodeJournal(msg, nil)
	if err != nil || len(back) != 2 {
		t.Fatalf("decode: %+v, %v", back, err)
	}
	for i, w := range recs[:2] {
		g := back[i]
		if g.Key != w.Key || !g.Expires.Equal(w.Expires) || g.ToTag != w.ToTag || g.Src != w.Src || g.Linger != w.Linger || g.Backend != w.Backend {
			t.Errorf("record %d: %+v, want %+v", i, g, w)
		}
	}

	// A batch over journalMsgMax goes as several messages, none longer.
	var many []DialogRecord
	for i := range 2000 {
		many = append(many, DialogRecord{Key: uint64(i + 1), Expires: exp, ToTag: 1, Backend: "sip-backend-" + strconv.Itoa(i)})
	}
	var all []DialogRecord
	msgs := 0
	for left := many; len(left) > 0; {
		msg, left = appendJournal(msg, left)
		if len(msg) > journalMsgMax {
			t.Fatalf("message of %d bytes", len(msg))
		}
		msgs++
		if all, err = decodeJournal(msg, all); err != nil {
			t.Fatal(err)
		}
	}
	if len(all) != len(many) || msgs < 2 || all[1999].Backend != "sip-backend-1999" {
		t.Fatalf("%d records in %d messages", len(all), msgs)
	}

	bad := []struct {
		name string
		msg  []byte
		n    int
	}{
		{"empty", nil, 0},
		{"other version", []byte{2, 0, 0}, 0},
		{"record cut short", msg[:1+journalRecMin-1], 0},
		{"backend id cut short", append(append([]byte{1}, make([]byte, journalRecMin-1)...), 5, 'a'), 0},
		{"second record cut short", append(append([]byte{1}, make([]byte, journalRecMin)...), 1), 1},
	}
	for _, c := range bad {
		got, err := decodeJournal(c.msg, nil)
		if err == nil || len(got) != c.n {
			t.Errorf("%s: %d records, err %v; want %d and an error", c.name, len(got), err, c.n)
		}
	}
}

// TestDialogPrecedence: a confirmed dialog stored and live is not undone
// by an unconfirmed record or a deletion that reaches the store after it
// (a batch read before the 2xx, written after the journal), and is by a
// later confirmed state (linger) or once expired.
func TestDialogPrecedence(t *testing.T) {
	now := time.Now()
	hour := now.Add(time.Hour)
	unconfirmed := DialogRecord{Key: 1, Backend: "a", Expires: hour}
	confirmed := DialogRecord{Key: 1, Backend: "a", ToTag: 5, Expires: hour}
	lingering := DialogRecord{Key: 1, Backend: "a", ToTag: 5, Linger: true, Expires: now.Add(30 * time.Second)}
	deletion := DialogRecord{Key: 1}
	other := DialogRecord{Key: 1, Backend: "b", Expires: hour}
	cases := []struct {
		name    string
		batches [][]DialogRecord
		want    *DialogRecord // nil: none stored
	}{
		{"unconfirmed after confirmed", [][]DialogRecord{{confirmed}, {unconfirmed}}, &confirmed},
		{"deletion after confirmed", [][]DialogRecord{{confirmed}, {deletion}}, &confirmed},
		{"unconfirmed after confirmed, one batch", [][]DialogRecord{{confirmed}, {unconfirmed, deletion}}, &confirmed},
		{"linger after confirmed", [][]DialogRecord{{confirmed}, {lingering}}, &lingering},
		{"unconfirmed after linger", [][]DialogRecord{{lingering}, {unconfirmed}}, &lingering},
		{"confirmed after unconfirmed", [][]DialogRecord{{unconfirmed}, {confirmed}}, &confirmed},
		{"deletion of unconfirmed", [][]DialogRecord{{unconfirmed}, {deletion}}, nil},
		{"other backend after deletion of unconfirmed", [][]DialogRecord{{unconfirmed}, {deletion, other}}, &other},
		{"expired confirmed is replaced", [][]DialogRecord{{{Key: 1, Backend: "a", ToTag: 5, Expires: now.Add(-time.Second)}}, {other}}, &other},
		{"confirmed with its expiry past deletes", [][]DialogRecord{{confirmed}, {{Key: 1, Backend: "a", ToTag: 5, Expires: now.Add(-time.Second)}}}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			kv, err := openKV3(filepath.Join(t.TempDir(), "db"), slog.New(slog.DiscardHandler))
			if err != nil {
				t.Fatal(err)
			}
			defer kv.db.Close()
			for _, b := range c.batches {
				if err := kv.writeDialogs(b, now); err != nil {
					t.Fatal(err)
				}
			}
			got, _, err := kv.dialogs(now, 0, 0)
			if err != nil {
				t.Fatal(err)
			}
			if c.want == nil {
				if len(got) != 0 {
					t.Fatalf("stored %+v, want none", got)
				}
				return
			}
			if len(got) != 1 || got[0].Backend != c.want.Backend || got[0].ToTag != c.want.ToTag || got[0].Linger != c.want.Linger {
				t.Fatalf("stored %+v, want %+v", got, *c.want)
			}
		})
	}
}

// journalParentEnv makes the test binary a balancer that commits dialogs
// through the journal and is then killed (TestJournalSurvivesKill9).
const journalParentEnv = "SLUICE_PERSIST_JOURNAL_PARENT"

// journalParent opens a format 3 store on dir and commits batches of
// dialogs through the journal as fast as it can, printing the last key
// of each batch CommitDialogs took, until it is killed.
func journalParent(dir string) {
	s, err := Open(cfg3(dir), nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, "open:", err)
		os.Exit(1)
	}
	exp := time.Now().Add(time.Hour)
	key := uint64(0)
	for {
		batch := make([]DialogRecord, 50)
		for i := range batch {
			key++
			batch[i] = DialogRecord{Key: key, Backend: "pool\x00s" + strconv.Itoa(int(key%2)), ToTag: uint32(key), Src: 1, Expires: exp}
		}
		if s.CommitDialogs(batch) {
			fmt.Println(key)
		} else {
			key -= uint64(len(batch)) // not taken: send these keys again
			time.Sleep(time.Millisecond)
		}
	}
}

// TestJournalSurvivesKill9: dialogs whose CommitDialogs returned true
// are stored although the balancer is killed with SIGKILL right after
// (its store process, signalled by the kernel, commits what the journal
// holds and exits), and a store opened at once on the same directory
// waits for that and loads them all. With the store process killed
// together with its parent (the parent-death signal SIGKILL), the
// messages still in the socket are lost and this fails.
func TestJournalSurvivesKill9(t *testing.T) {
	skipShort(t)
	for round := range 3 {
		dir := t.TempDir()
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), journalParentEnv+"="+dir)
		cmd.Stderr = os.Stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(out)
		acked := uint64(0)
		// Kill it after a number of batches that grows with the round.
		for sc.Scan() {
			k, err := strconv.ParseUint(sc.Text(), 10, 64)
			if err != nil {
				t.Fatalf("balancer said %q", sc.Text())
			}
			acked = k
			if acked >= uint64(2000*(round+1)) {
				break
			}
		}
		cmd.Process.Signal(syscall.SIGKILL)
		// Lines printed after the one read are acknowledged too: read on.
		for sc.Scan() {
			if k, err := strconv.ParseUint(sc.Text(), 10, 64); err == nil {
				acked = k
			}
		}
		cmd.Wait()
		if acked == 0 {
			t.Fatal("the balancer committed nothing")
		}
		s := openTest(t, cfg3(dir))
		ds, err := s.LoadDialogs(time.Now(), 0)
		if err != nil {
			t.Fatal(err)
		}
		have := make(map[uint64]bool, len(ds))
		for _, d := range ds {
			have[d.Key] = true
		}
		lost := 0
		for k := uint64(1); k <= acked; k++ {
			if !have[k] {
				lost++
			}
		}
		if lost > 0 {
			t.Fatalf("round %d: %d of %d dialogs the journal took lost after kill -9", round, lost, acked)
		}
		t.Logf("round %d: %d dialogs committed before kill -9, all stored (%d stored)", round, acked, len(ds))
		s.Close(bg)
	}
}

// BenchmarkCommitDialogs is the dialog journal end to end: b.N records
// sent with CommitDialogs in batches (batch=1: an idle balancer, one call
// per commit; batch=32: group commits under load) to a running store
// process, and committed by it (a request on the main socket at the end
// makes it drain the journal first); a send its socket cannot take yet
// waits 100 µs and is sent again (counted: full/op). ns/op is per record:
// its inverse is the records per second the store process commits.
func BenchmarkCommitDialogs(b *testing.B) {
	if testing.Short() {
		b.Skip("starts a store process")
	}
	for _, batch := range []int{1, 32} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			s, err := Open(cfg3(b.TempDir()), nil)
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close(bg)
			exp := time.Now().Add(time.Hour)
			recs := make([]DialogRecord, batch)
			full := 0
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i += batch {
				for j := range recs {
					recs[j] = DialogRecord{Key: uint64(i + j + 1), Backend: "default\x00s1", ToTag: 7, Src: 3, Expires: exp}
				}
				for !s.CommitDialogs(recs) {
					full++
					time.Sleep(100 * time.Microsecond)
				}
			}
			if err := s.SetClusterNodes(int64(b.N%1000 + 2)); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			b.ReportMetric(float64(full*batch)/float64(b.N), "full/op")
		})
	}
}

// TestStoppedOrphanStoreProcessKilled: a store process left by a killed
// balancer that cannot commit and exit (stopped with SIGSTOP: it ignores
// its parent-death signal until it runs again; SIGKILL as that signal
// used to end it) holds the database; the next store process waits for
// it, then kills it and opens the database.
func TestStoppedOrphanStoreProcessKilled(t *testing.T) {
	skipShort(t)
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), journalParentEnv+"="+dir)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(out)
	if !sc.Scan() {
		t.Fatal("the balancer committed nothing")
	}
	b, err := os.ReadFile(filepath.Join(dir, db3Dir, "LOCK"))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatalf("LOCK holds %q", b)
	}
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) })
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	cmd.Process.Signal(syscall.SIGKILL)
	for sc.Scan() {
	}
	cmd.Wait()
	s := openTest(t, cfg3(dir))
	if h := s.Health(); h.Child != ChildRunning {
		t.Fatalf("store process not running after the stopped one: %+v", h)
	}
	if _, err := s.LoadDialogs(time.Now(), 0); err != nil {
		t.Fatal(err)
	}
	// Gone, or a zombie nobody reaps (PID 1 of a container may not).
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err == nil {
		if f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:])); len(f) > 0 && f[0] != "Z" {
			t.Fatalf("the stopped store process %d is still there, state %s", pid, f[0])
		}
	}
}

// TestJournalOutageReportRateLimited: a journal that fails and recovers
// again and again is reported (WARN line and EventDialogsUnsafe) at most
// once per journalWarnEvery, the next report counting the outages it did
// not report, and "safe again" is logged only after a reported outage.
func TestJournalOutageReportRateLimited(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var logs bytes.Buffer
	s := &Store{cfg: Config{Dir: "/data", Now: func() time.Time { return now }}}
	r := &remote{s: s, log: slog.New(slog.NewTextHandler(&logs, nil))}
	s.rc = r
	r.journal.fd = -1
	var peers []int
	attach := func() {
		fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_SEQPACKET|syscall.SOCK_NONBLOCK, 0)
		if err != nil {
			t.Fatal(err)
		}
		peers = append(peers, fds[1])
		r.setJournal(fds[0])
	}
	defer func() {
		r.setJournal(-1)
		for _, fd := range peers {
			syscall.Close(fd)
		}
	}()
	rec := []DialogRecord{{Key: 1, Backend: "b", Expires: now.Add(time.Hour)}}
	events := func() int {
		n := 0
		for _, e := range r.events {
			if e.Kind == EventDialogsUnsafe {
				n++
			}
		}
		return n
	}
	// Each step: advance the clock, attach or detach the store, commit;
	// then what the log and the events hold in all.
	for i, st := range []struct {
		after    time.Duration
		attached bool
		ok       bool
		warns    int
		safe     int
		events   int
	}{
		{0, false, false, 1, 0, 1},                // first outage: reported
		{time.Second, true, true, 1, 1, 1},        // recovered: safe again
		{time.Second, false, false, 1, 1, 1},      // 2 s after the report: not reported
		{time.Second, true, true, 1, 1, 1},        // its end not logged either
		{time.Second, false, false, 1, 1, 1},      // another, unreported
		{time.Second, true, true, 1, 1, 1},        //
		{10 * time.Second, false, false, 2, 1, 2}, // past journalWarnEvery: reported, with 2 unreported before it
		{time.Second, true, true, 2, 2, 2},        //
	} {
		now = now.Add(st.after)
		if st.attached {
			attach()
		} else {
			r.setJournal(-1)
		}
		if ok := r.commitDialogs(rec); ok != st.ok {
			t.Fatalf("step %d: commit = %v, want %v", i, ok, st.ok)
		}
		out := logs.String()
		if w, sa, ev := strings.Count(out, "level=WARN"), strings.Count(out, "safe in the store again"), events(); w != st.warns || sa != st.safe || ev != st.events {
			t.Fatalf("step %d: %d WARN, %d safe-again lines, %d events; want %d, %d, %d\n%s", i, w, sa, ev, st.warns, st.safe, st.events, out)
		}
	}
	if !strings.Contains(logs.String(), "outages_unreported=2") {
		t.Errorf("the second report does not count the 2 outages before it:\n%s", logs.String())
	}
	if last := r.events[len(r.events)-1]; !strings.Contains(last.Message, "2 more outages since the last report") {
		t.Errorf("the second event says %q", last.Message)
	}
}
