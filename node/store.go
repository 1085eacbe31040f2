package node

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicelb/sluice/admin"
	"github.com/sluicelb/sluice/admission"
	"github.com/sluicelb/sluice/persist"
	lbsip "github.com/sluicelb/sluice/sip"
	"github.com/sluicelb/sluice/tlsedge"
)

// eventLog is the event sink of a run: every event is logged, and appended
// to the store once it is open. Events emitted before that (configuration
// warnings while the rules are built) wait in a small buffer.
type eventLog struct {
	logger *slog.Logger
	mu     sync.Mutex
	store  *persist.Store
	early  []admission.Event
}

const maxEarlyEvents = 1000

func (l *eventLog) emit(ev admission.Event) {
	// A configuration warning (a run-time change a reload dropped, one
	// not applied), a certificate file refused (found by the file poll as
	// well as on SIGHUP: the old certificate serves on) or one about to
	// expire, and the store process dying are an operator's to act on:
	// WARN, not INFO.
	level := slog.LevelInfo
	switch ev.Kind {
	case admission.EventConfigWarning, tlsedge.EventCertRefused, tlsedge.EventCertExpiring, persist.EventChildDied, persist.EventDialogsUnsafe:
		level = slog.LevelWarn
	}
	l.logger.Log(context.Background(), level, "event", "kind", string(ev.Kind), "subject", ev.Subject, "msg", ev.Message)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.store != nil {
		l.store.Append(ev)
		return
	}
	if len(l.early) < maxEarlyEvents {
		l.early = append(l.early, ev)
	}
}

// attach starts writing to st, first the events that waited for it.
func (l *eventLog) attach(st *persist.Store) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.store = st
	for _, ev := range l.early {
		st.Append(ev)
	}
	l.early = nil
}

func (l *eventLog) detach() {
	l.mu.Lock()
	l.store = nil
	l.mu.Unlock()
}

// EventNodeStarted is the event of a node's start on its data directory,
// with the learned rates it restored: in the event log, where a run
// begins (after a restart, a crash or kill -9 too).
const EventNodeStarted admission.EventKind = "node.started"

// openStore opens the data directory, gives every backend's MOP the state
// learned before the restart, and starts saving it. It runs before any
// front end serves, so no request is admitted at an unlearned rate.
func (n *Node) openStore() error {
	st, err := persist.Open(n.cfg.Persist, n.logger)
	if errors.Is(err, persist.ErrLocked) {
		return fmt.Errorf("open data directory: %w: another sluice runs on it (or one still drains: it is free once that one exits); give this one a -data-dir of its own", err)
	}
	if err != nil {
		return fmt.Errorf("open data directory: %w", err)
	}
	states, err := st.LoadMOP()
	if err != nil {
		st.Close(context.Background())
		return fmt.Errorf("load learned rates: %w", err)
	}
	imported := 0
	n.mopMu.Lock()
	mops := append([]mopEntry(nil), n.mops...)
	n.mopMu.Unlock()
	for _, e := range mops {
		s, ok := states[e.key]
		if !ok {
			continue
		}
		if err := e.mop.Import(s); err != nil {
			n.events(admission.Event{Time: time.Now(), Kind: admission.EventConfigWarning, Subject: e.key,
				Message: "stored learned rate not used: " + err.Error()})
			continue
		}
		imported++
		n.logger.Info("learned rate restored", "backend", e.key, "phase", s.Phase.String(), "learned_rate", s.LearnedRate, "allowed_rate", s.AllowedRate)
	}
	n.logger.Info("data directory open", "dir", st.Dir(), "learned_rates", len(states), "restored", imported)
	if keys, more := unmatchedKeys(slices.Collect(maps.Keys(states)), n.mopByKey, 5); len(keys) > 0 {
		n.logger.Info("learned rates stored for backends not configured now, not used: MOP is kept by protocol and address, a backend at another address learns again",
			"backends", strings.Join(keys, ", "), "more", more)
	}
	saver, err := st.NewSaver(n.mopStates)
	if err != nil {
		st.Close(context.Background())
		return fmt.Errorf("start saving learned rates: %w", err)
	}
	n.store, n.saver = st, saver
	n.eventLog.attach(st)
	// A mark in the event log (and on the dashboard) where this run
	// begins: after a kill -9 the log shows where the restart was.
	n.events(admission.Event{Time: time.Now(), Kind: EventNodeStarted, Subject: st.Dir(),
		Message: fmt.Sprintf("started: %d of %d stored learned rates restored", imported, len(states))})
	n.restoreDialogs(st)
	n.restoreHistory(st)
	if n.admin != nil {
		n.admin.Handle("GET /events", st.EventsHandler())
	}
	return nil
}

// mopStates exports every backend's learned state, keyed for the store.
func (n *Node) mopStates() map[string]admission.MOPState {
	n.mopMu.Lock()
	defer n.mopMu.Unlock()
	out := make(map[string]admission.MOPState, len(n.mops))
	for _, e := range n.mops {
		out[e.key] = e.mop.Export()
	}
	return out
}

// storeCloseTimeout bounds the final save at shutdown: a disk that does
// not answer must not keep the process from exiting.
const storeCloseTimeout = 3 * time.Second

// closeStore saves the learned rates a last time and closes the store,
// giving up after storeCloseTimeout.
func (n *Node) closeStore() {
	if n.store == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), storeCloseTimeout)
	defer cancel()
	if err := n.saver.Close(ctx); err != nil {
		n.logger.Error("final save of learned rates failed", "err", err)
	}
	n.eventLog.detach()
	n.history.st.Store(nil)
	if err := n.store.Close(ctx); err != nil {
		n.logger.Error("close data directory", "err", err)
	}
	n.store = nil
}

// storageStatus is the data directory's health for /status.
func (n *Node) storageStatus() any {
	if st := n.store; st != nil {
		return st.Health()
	}
	return nil
}

// keepDataKey writes the affinity key generated in the data directory
// back when the file has gone (the directory was removed or replaced while
// sluice ran): without it the next start would make a new key, and every
// sticky session and live SIP dialog would be new work again.
func (n *Node) keepDataKey(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n.restoreDataKey()
	}
}

// restoreDataKey is one check of keepDataKey.
func (n *Node) restoreDataKey() {
	if n.dataKeyFile == "" {
		return
	}
	if _, err := os.Stat(n.dataKeyFile); !errors.Is(err, fs.ErrNotExist) {
		return
	}
	dir := filepath.Dir(n.dataKeyFile)
	if _, err := os.Stat(dir); err != nil {
		return // the directory itself is gone: the store reports it
	}
	tmp := n.dataKeyFile + ".tmp"
	err := os.WriteFile(tmp, n.dataKey, 0o600)
	if err == nil {
		err = os.Rename(tmp, n.dataKeyFile)
	}
	if err != nil {
		os.Remove(tmp)
		n.logger.Warn("affinity key file missing and cannot be written back: a restart would make a new key", "file", n.dataKeyFile, "err", err)
		return
	}
	n.logger.Warn("affinity key file was missing: written back from memory, so a restart keeps sticky sessions and dialogs", "file", n.dataKeyFile)
	n.events(admission.Event{Time: time.Now(), Kind: admission.EventConfigWarning, Subject: n.dataKeyFile,
		Message: "affinity key file was missing from the data directory and was written back"})
}

// restoreDialogs fills the SIP dialog table with the dialogs stored before
// the restart (those not expired) and writes its changes through to st
// from now on. It runs before the SIP listener opens, so the in-dialog
// requests of calls set up before a kill -9 reach their backend. A store
// that cannot answer leaves the table empty: such requests then go by
// the Call-ID hash (or are refused with -sip-unknown-dialog reject).
func (n *Node) restoreDialogs(st *persist.Store) {
	if n.sipSrv == nil {
		return
	}
	now := time.Now()
	// A page at a time: a million stored dialogs are not held twice over
	// (records and their conversions) beside the table they fill.
	var in []lbsip.StoredDialog
	restored := 0
	read, err := st.EachDialogs(now, n.sipSrv.DialogMax(), func(page []persist.DialogRecord) {
		in = in[:0]
		for _, r := range page {
			in = append(in, lbsip.StoredDialog{Key: r.Key, Ref: r.Backend, ToTag: r.ToTag, Src: r.Src, Linger: r.Linger, Expires: r.Expires})
		}
		restored += n.sipSrv.RestoreDialogs(in, now)
	})
	if err != nil {
		n.logger.Error("SIP dialogs of before the restart not all restored (the store did not answer)", "err", err, "read", read, "restored", restored)
	}
	if read > 0 || err != nil {
		n.logger.Info("sip dialogs restored", "stored", read, "restored", restored)
	}
	if st.Journaled() {
		n.sipSrv.SetDialogStore(&journalDialogs{storeDialogs: storeDialogs{st}})
	} else {
		n.sipSrv.SetDialogStore(storeDialogs{st})
	}
}

// storeDialogs queues the SIP dialog table's changes on the store.
type storeDialogs struct{ st *persist.Store }

// WriteDialogs implements sip.DialogWriter.
func (d storeDialogs) WriteDialogs(put []lbsip.StoredDialog, del []uint64) {
	if len(put) > 0 {
		recs := make([]persist.DialogRecord, len(put))
		for i, p := range put {
			recs[i] = persist.DialogRecord{Key: p.Key, Backend: p.Ref, ToTag: p.ToTag, Src: p.Src, Linger: p.Linger, Expires: p.Expires}
		}
		d.st.PutDialogs(recs)
	}
	d.st.DeleteDialogs(del)
}

// journalDialogs also commits confirmed dialogs to the store's journal
// before their 2xx is relayed (sip.DialogCommitter), so that no call
// established through this node loses its backend to a kill -9.
type journalDialogs struct {
	storeDialogs
	recs []persist.DialogRecord // reused: one CommitDialogs at a time
}

// CommitDialogs implements sip.DialogCommitter.
func (d *journalDialogs) CommitDialogs(put []lbsip.StoredDialog) bool {
	d.recs = d.recs[:0]
	for _, p := range put {
		d.recs = append(d.recs, persist.DialogRecord{Key: p.Key, Backend: p.Ref, ToTag: p.ToTag, Src: p.Src, Linger: p.Linger, Expires: p.Expires})
	}
	return d.st.CommitDialogs(d.recs)
}

// fineHistoryKeep is how long the dashboard's 1 s samples are stored: the
// span of its 1 s ring (admin.DefaultHistorySamples at 1 s).
const fineHistoryKeep = admin.DefaultHistorySamples * time.Second

// coarseHistorySamples is the size of the dashboard's 10 s ring for a
// -history-retention (default 24 h); admin caps it at 7 days.
func coarseHistorySamples(retention time.Duration) int {
	if retention <= 0 {
		retention = persist.DefaultHistoryRetention
	}
	return int(min(retention/(10*time.Second), admin.MaxCoarseSamples))
}

// historyStore hands the dashboard's samples to the store while it is
// open (admin.HistoryStore); before and after, they are not kept.
type historyStore struct{ st atomic.Pointer[persist.Store] }

// SaveHistory implements admin.HistoryStore: it only queues the sample.
func (h *historyStore) SaveHistory(res string, at time.Time, row []byte) {
	st := h.st.Load()
	if st == nil {
		return
	}
	var keep time.Duration
	if res == admin.HistoryFine {
		keep = fineHistoryKeep
	}
	st.SaveHistory([]persist.HistorySample{{Time: at, Resolution: res, Data: row, Keep: keep}})
}

// restoreHistory fills the dashboard's rings with the samples stored
// before the restart, so its plots and /status/history go on from them,
// and has the dashboard store its samples from now on. It runs before the
// admin listener (and its sampler) starts.
func (n *Node) restoreHistory(st *persist.Store) {
	if n.dash == nil {
		return
	}
	now := time.Now()
	retention := n.cfg.Persist.HistoryRetention
	if retention <= 0 {
		retention = persist.DefaultHistoryRetention
	}
	// A store holds a ring's worth of samples (a few more where they
	// have not expired yet); more is a damaged store, not read past that.
	for _, r := range []struct {
		res  string
		keep time.Duration
		max  int
	}{{admin.HistoryFine, fineHistoryKeep, 2 * n.dash.History().Capacity()}, {admin.HistoryCoarse, retention, 2 * n.dash.Coarse().Capacity()}} {
		samples, err := st.LoadHistory(r.res, now.Add(-r.keep), r.max)
		if err != nil {
			n.logger.Warn("dashboard history of before the restart not restored", "resolution", r.res, "err", err)
		}
		rows := make([][]byte, len(samples))
		for i, s := range samples {
			rows[i] = s.Data
		}
		if len(rows) > 0 {
			n.logger.Info("dashboard history restored", "resolution", r.res, "stored", len(rows), "restored", n.dash.RestoreHistory(r.res, rows))
		}
	}
	n.history.st.Store(st)
}

// unmatchedKeys returns, sorted, at most max of the stored keys that no
// backend in force has, and how many more there are: the learned rates a
// start leaves unused, for the log line that says why "restored" is less
// than "learned_rates".
func unmatchedKeys[V any](stored []string, have map[string]V, max int) ([]string, int) {
	var out []string
	for _, k := range stored {
		if _, ok := have[k]; !ok {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	if len(out) > max {
		return out[:max], len(out) - max
	}
	return out, 0
}
