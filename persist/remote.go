package persist

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicelb/sluice/admission"
)

// EventChildDied is the event of the store process dying (its subject the
// signal or exit status); it is restarted with back-off.
const EventChildDied admission.EventKind = "persist.child_died"

// ChildCommand returns the command that runs the store process (format 3)
// for the data directory dir, for example the running binary with the
// hidden subcommand `store-child -dir DIR`. The store adds the socket as
// the child's fd 3 (cmd.ExtraFiles) and, on Linux, a parent-death signal.
type ChildCommand func(dir string) *exec.Cmd

// Defaults of the store process.
const (
	DefaultChildStartTimeout = 10 * time.Second
	DefaultChildCallTimeout  = 5 * time.Second
	DefaultQueueMax          = 8192
	DefaultHistoryRetention  = 24 * time.Hour
	childMinBackoff          = time.Second
	childMaxBackoff          = time.Minute
	// importChunk is how many events one migration request carries.
	importChunk = 2000
)

// Child states in Health.
const (
	ChildStarting = "starting"
	ChildRunning  = "running"
	ChildDown     = "down"
)

// errChildDown is returned by reads while no store process answers.
var errChildDown = errors.New("store process not running")

// remote is the balancer's side of the store process: it starts it,
// restarts it with backoff when it dies, and writes what the node hands
// the Store from a bounded queue. Nothing on a request's path waits on it.
type remote struct {
	s    *Store
	cmdf ChildCommand
	log  *slog.Logger

	minBackoff, maxBackoff time.Duration
	callTimeout            time.Duration
	queueMax               int

	// mu guards what waits to be written and the child's process.
	mu         sync.Mutex
	mop        map[string]admission.MOPState // changed since the last write
	ov         *[]Override
	cn         int64
	events     []seqEvent
	seq        uint64 // last event sequence given (from the stored log at load)
	history    []HistorySample
	dialogs    []DialogRecord
	delDialogs []uint64
	// spareDialogs is the dialog queue of the last write that succeeded,
	// emptied, for the next one: queueing a batch does not allocate.
	spareDialogs []DialogRecord
	proc         *os.Process
	// child is the store process from its start until it is reaped (proc
	// only while attached): Close kills it when its deadline passes
	// before the child exits. It gets no SIGKILL when sluice exits (the
	// parent-death signal lets it commit what it was sent), so a child
	// stuck (or stopped) would otherwise outlive sluice.
	child    *os.Process
	state    string
	lastExit string
	loaded   bool // the stored state was read from the child
	migrate  *migration
	inflight int       // records taken by a write under way
	mopSaved time.Time // when the store process last acknowledged learned states
	corrupt  error     // the stored state does not decode: Open fails

	notify   chan struct{} // a write is queued
	up       chan struct{} // closed when the child first answers and the store is loaded
	upOnce   sync.Once
	stop     chan struct{} // ends the supervisor
	pumpStop chan struct{} // ends the pump (first, at close)
	pumpDone chan struct{}
	done     sync.WaitGroup
	restarts atomic.Uint64
	dropped  atomic.Uint64 // history and dialog records not queued (queue full)
	// unanswered: the balancer killed the child because a request got no
	// answer in time, so that its death is not reported as a crash.
	unanswered atomic.Bool

	// callMu lets one request be in flight; conn is the socket (nil while
	// no child runs). conn is set under both callMu and mu.
	callMu sync.Mutex
	conn   net.Conn
	// out is the frame being sent and in reads the answers, both reused
	// (under callMu).
	out []byte
	in  frameReader

	// journal is the dialog journal's socket (journal.go).
	journal journal
}

// migration is a format 2 store read at open, written into the store
// process when it first answers.
type migration struct {
	mop       map[string]admission.MOPState
	overrides []Override
	cn        int64
	events    []admission.Event
	finish    func() error // writes the format file and moves the old files away
}

func newRemote(s *Store, cmdf ChildCommand, log *slog.Logger) *remote {
	r := &remote{
		s: s, cmdf: cmdf, log: log,
		minBackoff: s.cfg.childMinBackoff, maxBackoff: s.cfg.childMaxBackoff,
		callTimeout: s.cfg.ChildCallTimeout, queueMax: s.cfg.QueueMax,
		mop:      map[string]admission.MOPState{},
		notify:   make(chan struct{}, 1),
		up:       make(chan struct{}),
		stop:     make(chan struct{}),
		pumpStop: make(chan struct{}),
		pumpDone: make(chan struct{}),
		state:    ChildStarting,
		journal:  journal{fd: -1},
	}
	if r.minBackoff <= 0 {
		r.minBackoff = childMinBackoff
	}
	if r.maxBackoff <= 0 {
		r.maxBackoff = childMaxBackoff
	}
	return r
}

func (r *remote) start() {
	r.done.Add(1)
	go r.supervise()
	go r.pump()
}

func (r *remote) kick() {
	select {
	case r.notify <- struct{}{}:
	default:
	}
}

// spawn starts one store process and returns it with the parent's
// socket and the parent's end of the dialog journal.
func (r *remote) spawn() (*exec.Cmd, net.Conn, int, error) {
	fds, err := socketpair()
	if err != nil {
		return nil, nil, -1, fmt.Errorf("socketpair: %w", err)
	}
	jfds, err := journalPair()
	if err != nil {
		closeFD(fds[0])
		closeFD(fds[1])
		return nil, nil, -1, fmt.Errorf("socketpair for the dialog journal: %w", err)
	}
	pf := os.NewFile(uintptr(fds[0]), "store-parent")
	cf := os.NewFile(uintptr(fds[1]), "store-child")
	jf := os.NewFile(uintptr(jfds[1]), "store-journal")
	defer pf.Close()
	defer cf.Close()
	defer jf.Close()
	cmd := r.cmdf(r.s.cfg.Dir)
	cmd.ExtraFiles = []*os.File{cf, jf}
	cmd.Stderr = &faultWriter{w: cmd.Stderr}
	setParentDeath(cmd)
	if err := cmd.Start(); err != nil {
		closeFD(jfds[0])
		return nil, nil, -1, fmt.Errorf("start store process: %w", err)
	}
	conn, err := net.FileConn(pf)
	if err != nil {
		closeFD(jfds[0])
		cmd.Process.Kill()
		cmd.Wait()
		return nil, nil, -1, err
	}
	return cmd, conn, jfds[0], nil
}

// supervise keeps a store process running until stop is closed.
func (r *remote) supervise() {
	defer r.done.Done()
	backoff := r.minBackoff
	for {
		began := time.Now()
		cmd, conn, jfd, err := r.spawn()
		if err == nil {
			r.mu.Lock()
			r.child = cmd.Process
			r.mu.Unlock()
			err = r.attach(cmd, conn, jfd)
			if err != nil {
				cmd.Process.Kill()
			}
			exited := make(chan struct{})
			go func() {
				cmd.Wait()
				r.mu.Lock()
				r.child = nil
				r.mu.Unlock()
				close(exited)
			}()
			select {
			case <-exited:
			case <-r.stop:
				r.detach()
				r.reap(cmd, exited)
				return
			}
			r.detach()
			sig := childSignal(cmd.ProcessState, cmd.Stderr.(*faultWriter).signal())
			what := cmd.ProcessState.String()
			if err != nil {
				what = err.Error() + " (" + what + ")"
			}
			if r.unanswered.Swap(false) {
				what = "killed by the balancer, it did not answer within " + r.callTimeout.String() + " (stopped, or stuck on its disk): " + what
			}
			r.mu.Lock()
			r.lastExit = what
			r.mu.Unlock()
			r.restarts.Add(1)
			r.log.Error("store process died; the balancer runs on what it holds in memory and restarts it",
				"dir", r.s.cfg.Dir, "exit", what, "signal", sig, "restart_in", backoff.String())
			msg := "store process ended: " + what
			r.s.Append(admission.Event{Kind: EventChildDied, Subject: sig, Message: msg})
			r.s.fault("child", fmt.Errorf("%w: store process ended: %s", ErrUnwritable, what))
			if time.Since(began) > r.maxBackoff {
				backoff = r.minBackoff
			}
		} else {
			r.log.Error("store process cannot be started; retrying", "dir", r.s.cfg.Dir, "err", err, "retry_in", backoff.String())
			r.s.fault("child", err)
		}
		select {
		case <-time.After(backoff):
		case <-r.stop:
			return
		}
		backoff = min(2*backoff, r.maxBackoff)
	}
}

// reap waits for a store process that was told to end (its socket
// closed: it closes Badger and exits) and kills it by PID when it does
// not within the call timeout: Badger's Close can wait forever on a
// vanished directory.
func (r *remote) reap(cmd *exec.Cmd, exited chan struct{}) {
	select {
	case <-exited:
	case <-time.After(r.callTimeout):
		r.log.Warn("store process did not exit; killing it", "pid", cmd.Process.Pid)
		cmd.Process.Kill()
		<-exited
	}
}

// attach makes conn the socket once the child answers, loads the stored
// state the first time and finishes a pending migration.
func (r *remote) attach(cmd *exec.Cmd, conn net.Conn, jfd int) error {
	r.setJournal(jfd)
	r.callMu.Lock()
	r.mu.Lock()
	r.conn, r.proc = conn, cmd.Process
	r.mu.Unlock()
	r.callMu.Unlock()
	if _, err := r.callTimeoutOf(&request{Op: opPing}, r.s.cfg.ChildStartTimeout); err != nil {
		return err
	}
	r.mu.Lock()
	loaded, mig := r.loaded, r.migrate
	r.mu.Unlock()
	if mig != nil {
		if err := r.importV2(mig); err != nil {
			return fmt.Errorf("migrate format 2 store: %w", err)
		}
		if err := mig.finish(); err != nil {
			r.log.Warn("format 2 store written into the store process, but its files could not be moved away; the next start writes them again", "err", err)
		} else {
			r.log.Warn("store migrated to format 3 (Badger in the store process)", "dir", r.s.cfg.Dir,
				"states", len(mig.mop), "overrides", len(mig.overrides), "events", len(mig.events))
		}
		r.mu.Lock()
		r.migrate = nil
		r.mu.Unlock()
	}
	if !loaded {
		resp, err := r.call(&request{Op: opLoad})
		if err != nil {
			if errors.Is(err, ErrCorrupt) {
				r.mu.Lock()
				r.corrupt = err
				r.mu.Unlock()
				r.upOnce.Do(func() { close(r.up) }) // Open reports it
			}
			return fmt.Errorf("load store: %w", err)
		}
		r.s.merge(resp)
		r.mu.Lock()
		r.loaded = true
		r.seq = max(r.seq, resp.LastSeq)
		r.mu.Unlock()
	}
	r.mu.Lock()
	r.state = ChildRunning
	r.mu.Unlock()
	r.s.ok("child")
	r.upOnce.Do(func() { close(r.up) })
	r.kick()
	return nil
}

func (r *remote) importV2(m *migration) error {
	ov := m.overrides
	if _, err := r.call(&request{Op: opWrite, MOP: m.mop, Overrides: &ov, ClusterNodes: m.cn}); err != nil {
		return err
	}
	for evs := m.events; len(evs) > 0; {
		n := min(len(evs), importChunk)
		batch := make([]seqEvent, n)
		for i, ev := range evs[:n] {
			batch[i] = seqEvent{Event: ev}
		}
		if _, err := r.call(&request{Op: opWrite, Events: batch}); err != nil {
			return err
		}
		evs = evs[n:]
	}
	return nil
}

func (r *remote) detach() {
	r.mu.Lock()
	if r.state != ChildStarting {
		r.state = ChildDown
	}
	c := r.conn
	r.proc = nil
	r.mu.Unlock()
	r.setJournal(-1)
	if c != nil {
		c.Close() // a call in flight returns now
	}
	r.callMu.Lock()
	r.mu.Lock()
	r.conn = nil
	r.mu.Unlock()
	r.callMu.Unlock()
}

func (r *remote) call(req *request) (response, error) {
	return r.callTimeoutOf(req, r.callTimeout)
}

// callTimeoutOf sends req and waits for the answer for at most d. A
// store process that does not answer in time is killed: the stream is
// out of step, and a child stuck on its disk must not hold the data.
func (r *remote) callTimeoutOf(req *request, d time.Duration) (response, error) {
	r.callMu.Lock()
	defer r.callMu.Unlock()
	var resp response
	if r.conn == nil {
		return resp, errChildDown
	}
	if req.Now.IsZero() {
		req.Now = r.s.cfg.Now()
	}
	var err error
	r.out, err = appendRequest(r.out[:0], req)
	if err != nil {
		// Nothing was sent: the stream is in step.
		return resp, fmt.Errorf("store process: %s: %w", req.Op, err)
	}
	conn := r.conn
	conn.SetDeadline(time.Now().Add(d))
	_, err = conn.Write(r.out)
	if cap(r.out) > maxKeptBuf {
		r.out = nil
	}
	if err == nil {
		var data []byte
		if data, err = r.in.read(conn); err == nil {
			err = json.Unmarshal(data, &resp)
		}
	}
	if err != nil {
		if errors.Is(err, net.ErrClosed) {
			// detach closed the socket under this call: the store
			// process already ended and its exit is reported there.
			// Saying "use of closed network connection" as well would
			// replace that reason in the health report.
			return resp, fmt.Errorf("store process: %s: %w", req.Op, errChildDown)
		}
		r.mu.Lock()
		p := r.proc
		// The stream is out of step and the socket closed below: later
		// calls find no store process (errChildDown) until attach
		// brings the restarted one, instead of each writing on a
		// closed socket and reporting that over the kill's reason.
		r.conn = nil
		r.mu.Unlock()
		if p != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				r.unanswered.Store(true)
			}
			p.Kill()
		}
		conn.Close()
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return resp, fmt.Errorf("store process: no answer to %s within %v (stopped, or stuck on its disk): killed, restarted: %w", req.Op, d, err)
		}
		return resp, fmt.Errorf("store process: %s: %w", req.Op, err)
	}
	if resp.Err != "" {
		if resp.Corrupt {
			return resp, fmt.Errorf("store process: %s: %w: %s", req.Op, ErrCorrupt, resp.Err)
		}
		return resp, fmt.Errorf("store process: %s: %s", req.Op, resp.Err)
	}
	return resp, nil
}

// pump writes what is queued whenever something is, and retries every
// Config.Interval; it also runs the retention sweep.
func (r *remote) pump() {
	defer close(r.pumpDone)
	tick := time.NewTicker(r.s.cfg.Interval)
	defer tick.Stop()
	var sweep <-chan time.Time
	if r.s.cfg.SweepInterval > 0 {
		t := time.NewTicker(r.s.cfg.SweepInterval)
		defer t.Stop()
		sweep = t.C
	}
	for {
		select {
		case <-r.notify:
		case <-tick.C:
		case <-sweep:
			if _, err := r.s.SweepEvents(); err != nil && !errors.Is(err, errChildDown) {
				r.log.Warn("event sweep failed", "err", err)
			}
		case <-r.pumpStop:
			return
		}
		r.flush()
	}
}

// flush writes what is queued in one request; on failure it goes back to
// the queue (bounded: the oldest events beyond it are dropped, counted).
func (r *remote) flush() error {
	req := r.take()
	if req == nil {
		return nil
	}
	_, err := r.call(req)
	r.mu.Lock()
	r.inflight = 0
	if err == nil && len(req.MOP) > 0 {
		r.mopSaved = time.Now()
	}
	if err == nil && cap(req.Dialogs) <= max(r.queueMax, DefaultQueueMax) {
		clear(req.Dialogs)
		r.spareDialogs = req.Dialogs[:0]
	}
	r.mu.Unlock()
	if err != nil {
		r.putBack(req)
		if !errors.Is(err, errChildDown) {
			r.s.fault("child", fmt.Errorf("%w: %v", ErrUnwritable, err))
		}
		return err
	}
	r.s.ok("child")
	return nil
}

func (r *remote) take() *request {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.conn == nil || r.state != ChildRunning || r.inflight > 0 {
		return nil
	}
	if len(r.mop) == 0 && r.ov == nil && r.cn == 0 && len(r.events) == 0 &&
		len(r.history) == 0 && len(r.dialogs) == 0 && len(r.delDialogs) == 0 {
		return nil
	}
	req := &request{Op: opWrite, MOP: r.mop, Overrides: r.ov, ClusterNodes: r.cn,
		Events: r.events, History: r.history, Dialogs: r.dialogs, DeleteDialogs: r.delDialogs,
		HistoryRetention: r.s.cfg.HistoryRetention}
	for i := range req.Events {
		if req.Events[i].Seq == 0 {
			r.seq++
			req.Events[i].Seq = r.seq
		}
	}
	r.inflight = len(req.MOP) + len(req.Events) + len(req.History) + len(req.Dialogs) + len(req.DeleteDialogs) + 1
	r.mop, r.ov, r.cn = map[string]admission.MOPState{}, nil, 0
	r.events, r.history, r.dialogs, r.delDialogs = nil, nil, nil, nil
	return req
}

// putBack returns a failed write to the queue, under what was queued
// since (which is newer).
func (r *remote) putBack(req *request) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for k, v := range req.MOP {
		if _, newer := r.mop[k]; !newer {
			r.mop[k] = v
		}
	}
	if r.ov == nil {
		r.ov = req.Overrides
	}
	if r.cn == 0 {
		r.cn = req.ClusterNodes
	}
	r.events = boundSlice(append(req.Events, r.events...), r.queueMax, &r.s.dropped)
	r.history = boundSlice(append(req.History, r.history...), r.queueMax, &r.dropped)
	r.dialogs = boundSlice(append(req.Dialogs, r.dialogs...), r.queueMax, &r.dropped)
	r.delDialogs = boundSlice(append(req.DeleteDialogs, r.delDialogs...), r.queueMax, &r.dropped)
}

// boundSlice keeps the newest max elements of s, counting the others.
func boundSlice[T any](s []T, max int, dropped *atomic.Uint64) []T {
	if len(s) <= max {
		return s
	}
	dropped.Add(uint64(len(s) - max))
	return append(s[:0:0], s[len(s)-max:]...)
}

// Queueing; called by the Store's methods. None blocks on the child.

func (r *remote) queueMOP(states map[string]admission.MOPState) {
	r.mu.Lock()
	maps.Copy(r.mop, states)
	r.mu.Unlock()
	r.kick()
}

func (r *remote) queueOverrides(ovs []Override) {
	r.mu.Lock()
	r.ov = &ovs
	r.mu.Unlock()
	r.kick()
}

func (r *remote) queueCluster(n int64) {
	r.mu.Lock()
	r.cn = n
	r.mu.Unlock()
	r.kick()
}

func (r *remote) queueEvent(ev admission.Event) {
	r.mu.Lock()
	if r.queueMax > 0 && len(r.events) >= r.queueMax {
		r.events = r.events[1:] // the oldest goes
		r.s.dropped.Add(1)
	}
	r.events = append(r.events, seqEvent{Event: ev})
	r.mu.Unlock()
	r.kick()
}

func (r *remote) queueHistory(h []HistorySample) {
	r.mu.Lock()
	r.history = boundSlice(append(r.history, h...), r.queueMax, &r.dropped)
	r.mu.Unlock()
	r.kick()
}

// queueDialogs queues puts and then deletions (records with a zero
// Expires) on one list, so that the store applies them in order.
func (r *remote) queueDialogs(put []DialogRecord, del []uint64) {
	r.mu.Lock()
	q := r.dialogs
	if q == nil {
		q, r.spareDialogs = r.spareDialogs, nil
	}
	q = append(q, put...)
	for _, k := range del {
		q = append(q, DialogRecord{Key: k})
	}
	r.dialogs = boundSlice(q, r.queueMax, &r.dropped)
	r.mu.Unlock()
	r.kick()
}

func (r *remote) pending() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.events) + len(r.history) + len(r.dialogs) + len(r.delDialogs) + r.inflight
}

// close writes what is queued (within ctx), closes the socket so that
// the child closes Badger and exits, and kills it by PID when it does
// not exit in time.
func (r *remote) close(ctx context.Context) error {
	var err error
	close(r.pumpStop)
	select {
	case <-r.pumpDone: // its write under way is done or put back
	case <-ctx.Done():
	}
	for r.pending() > 0 || r.dirty() {
		if ctx.Err() != nil {
			err = ctx.Err()
			break
		}
		if ferr := r.flush(); ferr != nil {
			err = ferr
			break
		}
		if !r.running() {
			err = errChildDown
			break
		}
	}
	close(r.stop)
	stopped := make(chan struct{})
	go func() { r.done.Wait(); close(stopped) }()
	select {
	case <-stopped:
	case <-ctx.Done():
		r.killChild()
		err = errors.Join(err, ctx.Err())
	}
	if n := r.pending(); n > 0 {
		err = errors.Join(err, fmt.Errorf("%d queued records could not be written", n))
	}
	return err
}

// killChild kills the store process, if one runs.
func (r *remote) killChild() {
	r.mu.Lock()
	if r.child != nil {
		r.child.Kill()
	}
	r.mu.Unlock()
}

func (r *remote) running() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.state == ChildRunning && r.conn != nil
}

func (r *remote) dirty() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.mop) > 0 || r.ov != nil || r.cn != 0
}

func (r *remote) health(h *Health) {
	r.mu.Lock()
	h.Child = r.state
	h.ChildLastExit = r.lastExit
	h.MOPSavedAt = r.mopSaved
	h.EventsPending = len(r.events)
	h.QueuePending = len(r.history) + len(r.dialogs) + len(r.delDialogs)
	if r.state != ChildRunning {
		h.Healthy = false
	}
	r.mu.Unlock()
	h.ChildRestarts = r.restarts.Load()
	h.QueueDropped = r.dropped.Load()
}
