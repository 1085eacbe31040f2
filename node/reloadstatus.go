package node

import (
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/sluicelb/sluice/admin"
)

// reloadLog keeps the outcome of the last reload of each configuration
// file for /status: a SIGHUP reloads -backends-file and -arm-file one
// after the other, and what the first dropped must not be hidden by the
// second's success.
type reloadLog struct {
	mu     sync.Mutex
	byFile map[string]admin.ReloadStatus
	order  []string // files in order of first reload, for a stable text
}

// reloaded records the outcome of a reload of file: err nil when it
// took, and the run-time changes it dropped.
func (n *Node) reloaded(file string, err error, dropped []string) {
	l := &n.reloads
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.byFile == nil {
		l.byFile = map[string]admin.ReloadStatus{}
	}
	if _, ok := l.byFile[file]; !ok {
		l.order = append(l.order, file)
	}
	st := admin.ReloadStatus{Time: time.Now(), OK: err == nil, Dropped: slices.Clone(dropped)}
	if err != nil {
		st.Error = err.Error()
	}
	l.byFile[file] = st
}

// lastReload is the last reload of each file, together: the latest time,
// ok when each took, their errors and every change they dropped; nil
// before the first reload.
func (n *Node) lastReload() *admin.ReloadStatus {
	l := &n.reloads
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.order) == 0 {
		return nil
	}
	out := &admin.ReloadStatus{OK: true, Dropped: []string{}}
	var errs []error
	for _, file := range l.order {
		st := l.byFile[file]
		if st.Time.After(out.Time) {
			out.Time = st.Time
		}
		if !st.OK {
			out.OK = false
			errs = append(errs, errors.New(st.Error))
		}
		out.Dropped = append(out.Dropped, st.Dropped...)
	}
	if err := errors.Join(errs...); err != nil {
		out.Error = err.Error()
	}
	return out
}
