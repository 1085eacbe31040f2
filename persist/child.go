package persist

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"syscall"
	"time"
)

// ChildExitDirGone is the exit status of a store process whose data
// directory was removed or replaced: Badger would keep writing into
// unlinked files (and its Close would wait for a flush that never
// succeeds), so the process exits and the balancer starts a new one,
// which creates the directory again.
const ChildExitDirGone = 3

// RunChild is the store process: it owns the format 3 Badger database in
// dir and answers the balancer's requests on conn until conn reaches EOF
// (the balancer closed it or died), commits the dialog journal (journal,
// nil: none) to its end, then closes the database. It is run by the
// hidden subcommand `sluice store-child -dir DIR` with conn on fd 3 and
// journal on fd 4. A fault of the disk may kill this process (Badger
// writes through memory mappings: SIGBUS on a full filesystem); the
// balancer sees it and starts another.
//
// When the balancer dies, what it sent is still in both sockets: this
// process reads on to their ends and commits it (requests are applied
// even once their answers cannot be written), bounded by
// childDrainTimeout from the parent-death signal. A store process left by
// a balancer killed just before holds the database for that long: this
// one waits for it (childLockWait at most, logged).
func RunChild(dir string, conn io.ReadWriteCloser, journal *os.File, log *slog.Logger) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	stopWatch := watchParentDeath(log)
	defer stopWatch()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create data directory %s: %w", dir, err)
	}
	dirInfo, err := os.Stat(dir)
	if err != nil {
		return err
	}
	kv, err := openKV3Wait(filepath.Join(dir, db3Dir), childLockWait, log)
	if err != nil {
		return fmt.Errorf("open store %s: %w", filepath.Join(dir, db3Dir), err)
	}
	go watchDir(dir, dirInfo, log)
	// mu orders the journal's commits and the requests' (journal.go).
	var mu sync.Mutex
	var jr *journalReader
	if journal != nil {
		if jr, err = startJournal(journal, kv, &mu, log); err != nil {
			log.Error("store process: dialog journal not read", "err", err)
		}
	}
	answer := true
	var fr frameReader
	var out []byte
	for {
		var req request
		if err := fr.readRequest(conn, &req); err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
				log.Error("store process: reading a request", "err", err)
			}
			break
		}
		mu.Lock()
		if jr != nil && (req.Op == opWrite || req.Op == opLoadDialogs) {
			jr.drainLocked()
		}
		resp := serve(kv, &req)
		mu.Unlock()
		if !answer {
			continue
		}
		var err error
		out, err = appendJSONFrame(out[:0], &resp)
		if errors.Is(err, errTooLarge) {
			out, err = appendJSONFrame(out[:0], response{Err: err.Error()})
		}
		if err == nil {
			_, err = conn.Write(out)
		}
		if cap(out) > maxKeptBuf {
			out = nil
		}
		if err != nil {
			// The balancer is gone (or the stream is out of step): apply
			// what it sent before, unanswered, to the end.
			log.Error("store process: writing a response; applying the requests already sent without answers", "err", err)
			answer = false
		}
	}
	conn.Close()
	if jr != nil {
		jr.wait(childDrainTimeout)
	}
	return kv.db.Close()
}

func serve(kv *kv3, req *request) (resp response) {
	var err error
	now := req.Now
	if now.IsZero() {
		now = time.Now()
	}
	switch req.Op {
	case opPing:
	case opLoad:
		resp, err = kv.load()
	case opWrite:
		err = kv.write(req, now)
	case opEvents:
		if req.Query == nil {
			err = errors.New("events: no query")
			break
		}
		resp, err = kv.events(*req.Query)
	case opSweep:
		if req.Query == nil {
			err = errors.New("sweep: no query")
			break
		}
		resp.Deleted, err = kv.sweep(req.Query.Until, req.Query.Limit)
	case opHistory:
		res := ""
		if req.Query != nil {
			res = req.Query.Kind
		}
		resp.History, resp.More, err = kv.history(res, req.Since, req.Limit)
	case opLoadDialogs:
		resp.DialogPage, resp.More, err = kv.dialogPageMsg(now, req.After, req.Limit)
	default:
		err = fmt.Errorf("unknown operation %q", req.Op)
	}
	if err != nil {
		resp.Err = err.Error()
		resp.Corrupt = errors.Is(err, ErrCorrupt)
	}
	return resp
}

// watchDir exits the process when dir is removed or replaced.
func watchDir(dir string, was os.FileInfo, log *slog.Logger) {
	for range time.Tick(time.Second) {
		fi, err := os.Stat(dir)
		if err == nil && os.SameFile(fi, was) {
			continue
		}
		if err == nil || errors.Is(err, os.ErrNotExist) {
			log.Error("store process: data directory removed or replaced; exiting so that a new one starts", "dir", dir)
			os.Exit(ChildExitDirGone)
		}
	}
}

// signalNames name the signals a store process is seen to die of.
var signalNames = map[syscall.Signal]string{
	syscall.SIGKILL: "SIGKILL", syscall.SIGBUS: "SIGBUS", syscall.SIGSEGV: "SIGSEGV",
	syscall.SIGTERM: "SIGTERM", syscall.SIGABRT: "SIGABRT", syscall.SIGINT: "SIGINT",
	syscall.SIGQUIT: "SIGQUIT",
}

// goFault finds the signal in the Go runtime's crash report ("[signal
// SIGBUS: bus error ...]" after a fault, "SIGBUS: bus error" at the start
// of a line for a signal sent by another process): the runtime turns a fault such as Badger's
// SIGBUS on a full disk into exit status 2, so the wait status does not
// name it.
var goFault = regexp.MustCompile(`(?m)(?:\[signal |^)(SIG[A-Z]+): `)

// childSignal is the signal that ended a store process: from its wait
// status, else from the crash report on its stderr; "" when it exited.
func childSignal(ps *os.ProcessState, fault string) string {
	if ps != nil {
		if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			if n, ok := signalNames[ws.Signal()]; ok {
				return n
			}
			return ws.Signal().String()
		}
	}
	return fault
}

// faultWriter passes what the store process writes to its stderr on to
// w and finds the signal of a Go crash report in it (the report goes on
// with every goroutine's stack, so it is looked for as it streams).
type faultWriter struct {
	w     io.Writer
	mu    sync.Mutex
	carry []byte // the end of the previous write, for a line split across writes
	sig   string
}

func (t *faultWriter) Write(p []byte) (int, error) {
	t.mu.Lock()
	if t.sig == "" {
		buf := append(t.carry, p...)
		if m := goFault.FindSubmatch(buf); m != nil {
			t.sig = string(m[1])
		}
		t.carry = append(t.carry[:0], buf[max(0, len(buf)-64):]...)
	}
	t.mu.Unlock()
	if t.w != nil {
		t.w.Write(p)
	}
	return len(p), nil
}

func (t *faultWriter) signal() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.sig
}
