package admin

import (
	"fmt"
	"testing"
	"time"
)

// TestHostileHistoryFutureRow: a damaged store holds a row dated far
// in the future. Restored, it would be the ring's newest sample: the
// page (which asks for the samples after the newest it has) would never
// see a live one again, and the coarse ring, which samples 10 s after
// its newest, would stop until that date. Such a row is left out.
func TestHostileHistoryFutureRow(t *testing.T) {
	src := Source{Backends: func() []BackendStatus { return []BackendStatus{backend("a", "up", 1, 1, 40)} }}
	past := fmt.Appendf(nil, `{"t":%d,"ms":0}`, t0.Add(-time.Minute).UnixMilli())
	future := fmt.Appendf(nil, `{"t":%d,"ms":0}`, time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC).UnixMilli())
	for _, res := range []string{HistoryFine, HistoryCoarse} {
		t.Run(res, func(t *testing.T) {
			d := NewDashboard(DashboardConfig{Source: src}, nil)
			if n := d.RestoreHistory(res, [][]byte{past, future}); n != 1 {
				t.Errorf("restored %d rows, want 1 (the row of year 3000 left out)", n)
			}
			d.Sample(t0)
			h := d.hist
			if res == HistoryCoarse {
				h = d.Coarse()
			}
			doc := decodeHistory(t, h, 0)
			if len(doc.T) != 2 || doc.T[1] != float64(t0.Unix()) {
				t.Errorf("after a live sample: t %v, want the restored one and %d", doc.T, t0.Unix())
			}
		})
	}
}
