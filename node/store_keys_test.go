package node

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluicelb/sluice/admission"
	"github.com/sluicelb/sluice/persist"
)

// A start that restored fewer learned rates than it found stored said
// nothing of the others ("learned_rates=4 restored=0"). unmatchedKeys
// names them, sorted and capped, for the log line that explains it.
func TestUnmatchedKeys(t *testing.T) {
	have := map[string]int{"sip/10.0.0.1:5060": 1, "http/10.0.0.2:80": 1}
	tests := []struct {
		stored []string
		max    int
		want   string
		more   int
	}{
		{nil, 5, "[]", 0},
		{[]string{"sip/10.0.0.1:5060", "http/10.0.0.2:80"}, 5, "[]", 0},
		{[]string{"sip/10.0.0.9:5060", "sip/10.0.0.1:5060", "http/10.0.0.3:80"}, 5, "[http/10.0.0.3:80 sip/10.0.0.9:5060]", 0},
		{[]string{"sip/c", "sip/a", "sip/b", "sip/10.0.0.1:5060"}, 2, "[sip/a sip/b]", 1},
	}
	for i, tt := range tests {
		got, more := unmatchedKeys(tt.stored, have, tt.max)
		if fmt.Sprint(got) != tt.want || more != tt.more {
			t.Errorf("%d: got %v, %d more; want %s, %d more", i, got, more, tt.want, tt.more)
		}
	}
}

// A second node on a data directory in use said only "data directory is
// in use by another process": the operator was left to guess whose, and
// what to do. It says another sluice holds it and to give a -data-dir.
func TestDataDirInUseSaysWhatToDo(t *testing.T) {
	cfg := testConfig(t)
	cfg.HTTPBackends = []string{"127.0.0.1:1"}
	first, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := first.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer first.Stop(time.Second)
	second, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = second.Start(context.Background())
	if err == nil {
		second.Stop(time.Second)
		t.Fatal("a second node started on a data directory in use")
	}
	if !errors.Is(err, persist.ErrLocked) || !strings.HasSuffix(err.Error(), ": another sluice runs on it (or one still drains: it is free once that one exits); give this one a -data-dir of its own") {
		t.Errorf("error %q", err)
	}
}

// After a kill -9 the event log showed no sign of the restart: the events
// of the run before and the new run's ran together. A start is an event.
func TestStartIsAnEvent(t *testing.T) {
	cfg := testConfig(t)
	cfg.HTTPBackends = []string{"127.0.0.1:1"}
	n, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	var evs dnsEvents
	inner := n.events
	n.events = func(e admission.Event) { evs.mu.Lock(); evs.all = append(evs.all, e); evs.mu.Unlock(); inner(e) }
	if err := n.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer n.Stop(time.Second)
	if got := evs.kinds(EventNodeStarted); len(got) != 1 || got[0] != "started: 0 of 0 stored learned rates restored" {
		t.Errorf("node.started events %q, want one", got)
	}
}
