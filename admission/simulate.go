package admission

import (
	"fmt"
	"time"
)

// IntervalRow is one row of the TDWM seed's table: what happened to one rule
// in one sub-interval.
type IntervalRow struct {
	Interval int           `json:"interval"` // from 1
	Start    time.Duration `json:"-"`        // offset of the sub-interval's start
	Arrived  int           `json:"arrived"`
	Admitted int           `json:"admitted"` // admitted on arrival
	Released int           `json:"released"` // admitted from the delay queue
	Refused  int           `json:"refused"`
	Rate     int64         `json:"rate"`   // arrival rate after the interval
	Queued   int64         `json:"queued"` // delay queue length after the interval
}

// Simulate replays arrivals, given per sub-interval, through one rule in the
// Normal memory state, in fake time. Within a sub-interval the order is:
// expiry of the oldest sub-interval, release of delayed requests, then that
// interval's arrivals. It is the engine of `sluice simulate` and of the
// golden tests.
func Simulate(rc RuleConfig, arrivals []int) ([]IntervalRow, error) {
	m, err := NewMeter(rc, 0, nil)
	if err != nil {
		return nil, err
	}
	rows := make([]IntervalRow, 0, len(arrivals))
	for i, n := range arrivals {
		if n < 0 {
			return nil, fmt.Errorf("interval %d: arrivals must not be negative (got %d)", i+1, n)
		}
		start := int64(i) * m.sub
		row := IntervalRow{Interval: i + 1, Start: time.Duration(start), Arrived: n}
		refusedBefore := m.refused.Load()
		row.Released = m.Advance(start)
		for k := 0; k < n; k++ {
			// Arrivals are spread inside the sub-interval so waits can run out.
			at := start + int64(k)*(m.sub/int64(n+1))
			if at > start {
				row.Released += m.Advance(at)
			}
			if d := m.Admit(at, Normal); d.Verdict == Admit {
				row.Admitted++
			}
		}
		row.Refused = int(m.refused.Load() - refusedBefore)
		st := m.Status()
		row.Rate, row.Queued = st.Rate, st.Queued
		rows = append(rows, row)
	}
	return rows, nil
}
