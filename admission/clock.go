package admission

import (
	"sync/atomic"
	"time"
)

// Clock gives the current time as monotonic nanoseconds. Decisions take a
// time value rather than reading a clock themselves, so callers read the clock
// once per request and tests control time exactly.
type Clock interface {
	// Now returns monotonic nanoseconds. Only differences are meaningful.
	Now() int64
}

// MonoClock reads the process's monotonic clock. Its zero value is ready to
// use; it measures from the first time the package was loaded.
type MonoClock struct{}

var processStart = time.Now()

// Now returns the nanoseconds since the process started.
func (MonoClock) Now() int64 { return int64(time.Since(processStart)) }

// ManualClock is a Clock that moves only when told to. It is safe for
// concurrent use and meant for tests and offline simulation.
type ManualClock struct{ nanos atomic.Int64 }

// Now returns the clock's current reading.
func (c *ManualClock) Now() int64 { return c.nanos.Load() }

// Set moves the clock to t nanoseconds.
func (c *ManualClock) Set(t int64) { c.nanos.Store(t) }

// Advance moves the clock forward by d and returns the new reading.
func (c *ManualClock) Advance(d time.Duration) int64 { return c.nanos.Add(int64(d)) }
