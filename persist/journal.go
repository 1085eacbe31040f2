package persist

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sluicelb/sluice/admission"
)

// The dialog journal makes a call's dialog record safe against kill -9
// of the balancer before the call's 2xx is relayed, without the data
// plane waiting on a disk (see README.md, "Dialogs and kill -9"):
//
//   - The balancer hands confirmed dialogs to CommitDialogs, which sends
//     them as one message on a second socketpair (SOCK_SEQPACKET, the
//     store process's fd 4) with MSG_DONTWAIT: the message is in the
//     kernel's socket buffer when it returns true, whole (a message is
//     queued whole or not at all), and a kill -9 of the balancer cannot
//     take it back. A full buffer or a store process that is not running
//     returns false at once; the caller relays the 2xx anyway.
//   - When the balancer dies, the kernel sends the store process
//     parentDeathSignal (not SIGKILL): it goes on reading both sockets to
//     their end, commits what they held to Badger, and exits; at most
//     childDrainTimeout after the signal it exits whatever it is doing.
//   - A restarted balancer's store process waits (childLockWait at most)
//     for the old one to release Badger's directory lock, so the dialogs
//     it loads include everything the old one committed.

// EventDialogsUnsafe is the event of a dialog journal write that failed
// (store process down or its socket full): the 2xx of those calls was
// relayed before their dialog was safe against kill -9 of the balancer.
// It is added once per outage, and at most once per journalWarnEvery
// (a socket that fills and drains again and again is one report, with
// the count of outages since the last); the SIP front end counts the
// calls.
const EventDialogsUnsafe admission.EventKind = "persist.dialogs_unsafe"

// journalWarnEvery bounds how often a journal outage is reported (the
// WARN line and EventDialogsUnsafe), and so the "safe again" line that
// ends a reported one.
const journalWarnEvery = 10 * time.Second

const (
	// journalMsgMax bounds one journal message; a batch longer than this
	// goes as several.
	journalMsgMax = 16 << 10
	// journalSndBuf is the send buffer asked for the balancer's end of
	// the journal socket: a few hundred messages of a few records.
	journalSndBuf = 1 << 20
	// journalVersion is the first byte of a journal message.
	journalVersion = 1
	// journalRecMin is a record without its backend id: key, expiry,
	// To-tag hash, source hash, linger flag, id length.
	journalRecMin = 8 + 8 + 4 + 2 + 1 + 1
	// childDrainTimeout bounds how long a store process whose balancer
	// died goes on committing what it was sent.
	childDrainTimeout = 2 * time.Second
	// childLockWait bounds how long a store process waits for the
	// database held by the store process of a balancer that died.
	childLockWait = 5 * time.Second
)

// appendJournal encodes records of recs into msg (the version byte
// first) until the next would make it longer than journalMsgMax, and
// returns the message and the records left. A backend id longer than
// maxDialogBackend is left out (the store never keeps one).
func appendJournal(msg []byte, recs []DialogRecord) ([]byte, []DialogRecord) {
	msg = append(msg[:0], journalVersion)
	for len(recs) > 0 {
		d := recs[0]
		if len(d.Backend) > maxDialogBackend {
			recs = recs[1:]
			continue
		}
		if len(msg)+journalRecMin+len(d.Backend) > journalMsgMax {
			break
		}
		msg = appendDialogRec(msg, d)
		recs = recs[1:]
	}
	return msg, recs
}

// decodeJournal appends the records of one journal message to out. A
// message of another version, or one cut short, adds what it holds
// whole before the damage and an error.
func decodeJournal(msg []byte, out []DialogRecord) ([]DialogRecord, error) {
	return decodeJournalIDs(msg, out, nil)
}

// decodeJournalIDs is decodeJournal taking each backend id from ids,
// where the same id is one string for all its records; nil makes a
// string per record.
func decodeJournalIDs(msg []byte, out []DialogRecord, ids *idInterner) ([]DialogRecord, error) {
	if len(msg) == 0 || msg[0] != journalVersion {
		return out, errors.New("journal message: unknown version")
	}
	p := msg[1:]
	for len(p) > 0 {
		if len(p) < journalRecMin || len(p) < journalRecMin+int(p[journalRecMin-1]) {
			return out, errors.New("journal message: record cut short")
		}
		n := int(p[journalRecMin-1])
		ns := binary.BigEndian.Uint64(p[8:])
		if ns > 1<<63-1 {
			return out, errors.New("journal message: expiry out of range")
		}
		out = append(out, DialogRecord{
			Key:     binary.BigEndian.Uint64(p),
			Expires: time.Unix(0, int64(ns)),
			ToTag:   binary.BigEndian.Uint32(p[16:]),
			Src:     binary.BigEndian.Uint16(p[20:]),
			Linger:  p[22] == 1,
			Backend: ids.string(p[journalRecMin : journalRecMin+n]),
		})
		p = p[journalRecMin+n:]
	}
	return out, nil
}

// idInterner keeps one string per backend id (a node has a few backends;
// a batch or a page of dialogs names them over and over), at most
// maxInterned of them (more distinct ids than that get a string per
// record past them).
type idInterner struct{ m map[string]string }

func (in *idInterner) string(b []byte) string {
	if in == nil {
		return string(b)
	}
	if s, ok := in.m[string(b)]; ok {
		return s
	}
	s := string(b)
	if in.m == nil {
		in.m = map[string]string{}
	}
	if len(in.m) < maxInterned {
		in.m[s] = s
	}
	return s
}

// CommitDialogs sends records of confirmed dialogs to the store process
// at once, without waiting: true when every one of them is in the store
// process's socket, where a kill -9 of this process cannot lose them (the
// store process commits them even when this process dies right after).
// False when there is no store process (format 2, not started, dead) or
// its socket's buffer is full: the records are then only as safe as the
// batched write-through (PutDialogs) makes them. The first failure after
// a success adds EventDialogsUnsafe. Safe for concurrent use; it never
// blocks on I/O.
func (s *Store) CommitDialogs(recs []DialogRecord) bool {
	if s.rc == nil || s.isClosed() {
		return false
	}
	return s.rc.commitDialogs(recs)
}

// Journaled reports whether CommitDialogs can make dialogs safe: a
// format 3 store with a store process.
func (s *Store) Journaled() bool { return s.rc != nil }

// journal is the balancer's end of the journal socket.
type journal struct {
	mu   sync.Mutex
	fd   int // -1 while no store process is attached
	msg  []byte
	down bool // the last commit failed
	// warned is when an outage was last reported, quiet how many began
	// since without a report (journalWarnEvery), told whether the
	// outage under way was reported.
	warned time.Time
	quiet  int
	told   bool
}

func (r *remote) commitDialogs(recs []DialogRecord) bool {
	j := &r.journal
	j.mu.Lock()
	ok := j.fd >= 0
	var err error
	for ok && len(recs) > 0 {
		j.msg, recs = appendJournal(j.msg, recs)
		if len(j.msg) > 1 {
			err = sendJournal(j.fd, j.msg)
			ok = err == nil
		}
	}
	wasDown := j.down
	j.down = !ok
	var warn, safeAgain bool
	var quiet int
	switch {
	case !ok && !wasDown:
		now := r.s.cfg.Now()
		if warn = j.warned.IsZero() || now.Sub(j.warned) >= journalWarnEvery; warn {
			j.warned, quiet, j.quiet = now, j.quiet, 0
		} else {
			j.quiet++
		}
		j.told = warn
	case ok && wasDown:
		safeAgain, j.told = j.told, false
	}
	j.mu.Unlock()
	switch {
	case warn:
		why := "store process not running"
		if err != nil {
			why = "journal socket: " + err.Error()
		}
		more := ""
		if quiet > 0 {
			more = "; " + strconv.Itoa(quiet) + " more outages since the last report"
		}
		r.log.Warn("SIP dialogs not safe against a kill -9 of sluice before their 2xx is relayed: relayed anyway; they are kept by the batched write-through only",
			"reason", why, "outages_unreported", quiet)
		r.s.Append(admission.Event{Kind: EventDialogsUnsafe, Subject: r.s.cfg.Dir,
			Message: "2xx relayed before the dialog was safe in the store (" + why + "); counted in sluice_frontend_events_total{event=\"dialog_store_unsafe\"}" + more})
	case safeAgain:
		r.log.Info("SIP dialogs safe in the store again before their 2xx is relayed")
	}
	return ok
}

// setJournal makes fd the journal socket (-1: none), closing the one
// before.
func (r *remote) setJournal(fd int) {
	j := &r.journal
	j.mu.Lock()
	if j.fd >= 0 {
		closeFD(j.fd)
	}
	j.fd = fd
	j.mu.Unlock()
}

// journalReader is the store process's end of the journal socket. Every
// read and commit of it happens under mu, which the request loop also
// holds while it applies a request: the loop drains the journal before a
// write, so a dialog record sent on the journal before a batch was sent
// on the stream is committed before that batch.
type journalReader struct {
	f    *os.File
	fd   int
	kv   *kv3
	mu   *sync.Mutex
	log  *slog.Logger
	buf  []byte
	recs []DialogRecord
	eof  bool
	done chan struct{}
}

// startJournal reads f (non-blocking, through the runtime's poller) until
// its end, committing every message.
func startJournal(f *os.File, kv *kv3, mu *sync.Mutex, log *slog.Logger) (*journalReader, error) {
	f, err := pollable(f)
	if err != nil {
		return nil, err
	}
	rc, err := f.SyscallConn()
	if err != nil {
		return nil, err
	}
	j := &journalReader{f: f, kv: kv, mu: mu, log: log, buf: make([]byte, 4*journalMsgMax), done: make(chan struct{})}
	if err := rc.Control(func(fd uintptr) { j.fd = int(fd) }); err != nil {
		return nil, err
	}
	go func() {
		defer close(j.done)
		err := rc.Read(func(uintptr) bool {
			j.mu.Lock()
			defer j.mu.Unlock()
			j.drainLocked()
			return j.eof
		})
		if err != nil && !errors.Is(err, os.ErrClosed) {
			log.Error("store process: reading the dialog journal", "err", err)
		}
	}()
	return j, nil
}

// drainLocked reads every message queued on the journal and commits
// their records in one batch; the caller holds mu.
func (j *journalReader) drainLocked() {
	if j.eof {
		return
	}
	j.recs = j.recs[:0]
	for {
		n, again, err := readFD(j.fd, j.buf)
		if again {
			break
		}
		if err != nil || n == 0 {
			// n == 0: the balancer closed its end (or died) and every
			// message is read; it never sends an empty one.
			if err != nil {
				j.log.Error("store process: reading the dialog journal", "err", err)
			}
			j.eof = true
			break
		}
		var derr error
		if j.recs, derr = decodeJournal(j.buf[:n], j.recs); derr != nil {
			j.log.Error("store process: dialog journal", "err", derr)
		}
	}
	if len(j.recs) == 0 {
		return
	}
	if err := j.kv.writeDialogs(j.recs, time.Now()); err != nil {
		j.log.Error("store process: committing journalled dialogs", "records", len(j.recs), "err", err)
	}
}

// wait waits for the end of the journal, at most d, and closes it.
func (j *journalReader) wait(d time.Duration) {
	select {
	case <-j.done:
	case <-time.After(d):
		j.log.Warn("store process: dialog journal not at its end; closing it", "after", d.String())
	}
	j.f.Close()
	<-j.done
}

// watchParentDeath handles parentDeathSignal: the balancer died. What it
// sent is still in the sockets, and the request loop and the journal
// reader commit it as they read on to the ends; this only bounds that,
// exiting the process childDrainTimeout later (what was committed by
// then is in Badger's write-ahead log, a shared memory mapping: it
// survives the exit). It returns a function that stops watching.
func watchParentDeath(log *slog.Logger) func() {
	if parentDeathSignal == nil {
		return func() {}
	}
	// The store process's stderr is a pipe the balancer reads: once it
	// is dead, a log line would raise SIGPIPE, which ends a Go program
	// writing to fd 2 unless SIGPIPE is ignored.
	signal.Ignore(syscall.SIGPIPE)
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, parentDeathSignal)
	stop := make(chan struct{})
	ppid := os.Getppid()
	go func() {
		for {
			select {
			case <-ch:
			case <-stop:
				return
			}
			// The kernel sends it when the thread that started this
			// process ends, which need not be the balancer's death;
			// anyone may send it too. Only a new parent (orphaned)
			// says the balancer is gone.
			if os.Getppid() != ppid {
				break
			}
			log.Warn("store process: parent-death signal while the balancer runs; ignored", "signal", parentDeathSignal.String())
		}
		log.Warn("store process: the balancer died; committing what it sent, then exiting", "within", childDrainTimeout.String())
		select {
		case <-time.After(childDrainTimeout):
			log.Error("store process: still committing after the balancer died; exiting", "after", childDrainTimeout.String())
			os.Exit(ChildExitDrainTimeout)
		case <-stop:
		}
	}()
	return func() { signal.Stop(ch); close(stop) }
}

// ChildExitDrainTimeout is the exit status of a store process that was
// still reading or committing childDrainTimeout after its balancer died.
const ChildExitDrainTimeout = 4

// openKV3Wait opens the database, waiting up to wait for the directory
// lock while another process (the store process of a balancer that was
// killed, still committing what it was sent) holds it. When the wait is
// over and the holder is a store process of this binary (the PID in
// Badger's lock file), it is stuck or stopped: it is killed, and the lock
// waited for once more.
func openKV3Wait(dir string, wait time.Duration, log *slog.Logger) (*kv3, error) {
	end := time.Now().Add(wait)
	logged, killed := false, false
	for {
		kv, err := openKV3(dir, log)
		if err == nil && logged {
			log.Warn("store process: database free; opened", "dir", dir)
		}
		if err == nil || !isBadgerLocked(err) {
			return kv, err
		}
		if time.Now().After(end) {
			pid := orphanStoreProcess(dir)
			if killed || pid == 0 {
				return nil, fmt.Errorf("%w (waited %s for the process holding it to exit)", err, wait)
			}
			log.Error("store process: the previous store process still holds the database; killing it (SIGKILL)",
				"dir", dir, "previous_pid", pid, "waited", wait.String())
			if kerr := killPID(pid); kerr != nil {
				return nil, fmt.Errorf("%w (waited %s; killing process %d: %v)", err, wait, pid, kerr)
			}
			killed, end = true, time.Now().Add(time.Second)
		}
		if !logged {
			log.Warn("store process: waiting for the previous store process to release the database (it commits what a killed balancer sent it)",
				"dir", dir, "at_most", wait.String())
			logged = true
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// isBadgerLocked reports whether err is Badger's refusal of a database
// another process holds.
func isBadgerLocked(err error) bool {
	return strings.Contains(err.Error(), "Another process is using this Badger database")
}
