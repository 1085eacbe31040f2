package persist

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/sluicelb/sluice/admission"
)

// Saver saves learned MOP states every Config.Interval on its own
// goroutine, and once more when it is closed. It pulls the states from the
// function it was given, so nothing on a request's path waits for the disk.
// At most one interval of learning is lost when the process is killed.
// A save the disk refuses is retried at the next interval; the store
// counts, logs and reports the failure (Store.Health).
type Saver struct {
	s        *Store
	states   func() map[string]admission.MOPState
	interval time.Duration

	mu       sync.Mutex // serialises saves
	failing  bool       // the last save had an invalid state; logged once per streak
	quit     chan struct{}
	done     chan struct{} // closed when the ticker loop has ended
	stopped  chan struct{} // closed when Close has finished
	stopOnce sync.Once
	stopErr  error
}

// NewSaver starts a Saver that calls states every Config.Interval and
// stores what it returns with SaveMOP; keys are MOPKey values. states is
// called from the Saver's goroutine, or from SaveNow and Close, never
// concurrently with itself.
// Close the Saver (or the Store) to stop it with a final save.
func (s *Store) NewSaver(states func() map[string]admission.MOPState) (*Saver, error) {
	if states == nil {
		return nil, errors.New("new saver: states function is nil")
	}
	if s.cfg.ReadOnly {
		return nil, fmt.Errorf("new saver for %s: store is read-only", s.cfg.Dir)
	}
	sv := &Saver{
		s:        s,
		states:   states,
		interval: s.cfg.Interval,
		quit:     make(chan struct{}),
		done:     make(chan struct{}),
		stopped:  make(chan struct{}),
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, fmt.Errorf("new saver for %s: %w", s.cfg.Dir, ErrClosed)
	}
	s.savers[sv] = struct{}{}
	s.mu.Unlock()
	go sv.run()
	return sv, nil
}

func (sv *Saver) run() {
	defer close(sv.done)
	t := time.NewTicker(sv.interval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			sv.save() // reported inside
		case <-sv.quit:
			return
		}
	}
}

// SaveNow saves the current states at once, outside the ticker.
func (sv *Saver) SaveNow() error { return sv.save() }

func (sv *Saver) save() error {
	sv.mu.Lock()
	defer sv.mu.Unlock()
	states := sv.states()
	if len(states) == 0 {
		return nil
	}
	err := sv.s.SaveMOP(states)
	// A disk failure is logged by the store, rate-limited; what is left
	// is a state that cannot be stored, logged once until saves work.
	invalid := err != nil && !errors.Is(err, ErrUnwritable)
	if invalid && !sv.failing {
		sv.s.log.Warn("learned mop state not saved", "dir", sv.s.cfg.Dir, "err", err)
	}
	sv.failing = invalid
	return err
}

// Close stops the Saver and saves the states a last time, returning the
// error of that save. It returns by ctx's deadline even when the disk
// does not answer (the save goes on, abandoned). Calls after the first
// wait for the same work and return its result.
func (sv *Saver) Close(ctx context.Context) error {
	sv.stopOnce.Do(func() {
		go func() {
			close(sv.quit)
			<-sv.done
			sv.stopErr = sv.save()
			sv.s.mu.Lock()
			delete(sv.s.savers, sv)
			sv.s.mu.Unlock()
			close(sv.stopped)
		}()
	})
	select {
	case <-sv.stopped:
		return sv.stopErr
	case <-ctx.Done():
		return fmt.Errorf("final save of learned rates to %s: %w", sv.s.cfg.Dir, ctx.Err())
	}
}
