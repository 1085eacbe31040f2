package admin

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/sluicelb/sluice/admission"
)

// memHistory is a HistoryStore that keeps the rows it is given.
type memHistory struct{ rows map[string][][]byte }

func (m *memHistory) SaveHistory(res string, _ time.Time, row []byte) {
	m.rows[res] = append(m.rows[res], row)
}

// TestHistoryRestoreRoundTrip: samples encoded one by one as they are
// recorded and restored into a new ring give the same /status/history
// document, NaN (no value) included; rows that do not decode, are not
// newer than the ring's newest or hold an unknown state are left out.
func TestHistoryRestoreRoundTrip(t *testing.T) {
	h := NewHistory(10)
	var rows [][]byte
	for i := range 6 {
		var c admission.Counts
		c.Refused[0][3] = uint64(4 * i)
		st := Status{MemoryState: []string{"normal", "low"}[i%2], Memory: MemoryStatus{UsedBytes: int64(1<<20 + i), LimitBytes: 1 << 30},
			Backends: []BackendStatus{backend("a", "up", uint64(100+10*i), uint64(200+15*i), 40)},
			ARM:      []RuleStatus{{Name: "r1", Rate: int64(i), Limit: 50, Queued: 2}}}
		if i >= 3 {
			st.Backends = append(st.Backends, backend("b", "draining", 5, 5, 12.5)) // appears later
		}
		h.Record(t0.Add(time.Duration(i)*time.Second), st, &c)
		_, row, ok := h.EncodeLast()
		if !ok {
			t.Fatal("no sample to encode")
		}
		rows = append(rows, row)
	}
	bad := append([][]byte{}, rows[:2]...)
	bad = append(bad, []byte("{not json"), rows[1], []byte(`{"t":1764496802500,"ms":9}`))
	bad = append(bad, rows[2:]...)

	r := NewHistory(10)
	if n := r.Restore(bad); n != len(rows) {
		t.Errorf("restored %d rows, want %d", n, len(rows))
	}
	var want, got bytes.Buffer
	h.WriteJSON(&want, 0)
	r.WriteJSON(&got, 0)
	if got.String() != want.String() {
		t.Errorf("restored history:\n%s\nwant:\n%s", got.String(), want.String())
	}
	d := decodeHistory(t, r, 0)
	if len(d.Backends) != 2 || show(d.Backends[1].State) != "[- - - 1 1 1]" || show(d.Backends[0].NewRate) != "[- 10 10 10 10 10]" {
		t.Errorf("restored backends: %+v", d.Backends)
	}
	// A live sample after the restore: its rates start over.
	r.Record(t0.Add(10*time.Second), Status{MemoryState: "normal", Backends: []BackendStatus{backend("a", "up", 500, 500, 40)}}, nil)
	if d := decodeHistory(t, r, 0); len(d.T) != 7 || d.Backends[0].NewRate[6] != nil {
		t.Errorf("live sample after the restore: t %v, new_rate %s", d.T, show(d.Backends[0].NewRate))
	}
}

// TestDashboardHistoryAcrossRestart: a dashboard hands every sample of
// its 1 s ring and one every 10 s of its coarse ring to the store; a new
// dashboard (the restarted node) given those rows serves the same
// /status/history at both resolutions.
func TestDashboardHistoryAcrossRestart(t *testing.T) {
	reqs := uint64(0)
	src := Source{Backends: func() []BackendStatus {
		reqs += 7
		return []BackendStatus{backend("a", "up", reqs, reqs, 40)}
	}}
	store := &memHistory{rows: map[string][][]byte{}}
	d := NewDashboard(DashboardConfig{Source: src, Store: store}, nil)
	for i := range 25 {
		d.Sample(t0.Add(time.Duration(i) * time.Second))
	}
	if n := len(store.rows[HistoryFine]); n != 25 {
		t.Errorf("%d 1 s rows stored, want 25", n)
	}
	if n := len(store.rows[HistoryCoarse]); n != 3 { // at 0, 10 and 20 s
		t.Errorf("%d 10 s rows stored, want 3", n)
	}

	d2 := NewDashboard(DashboardConfig{Source: src}, nil)
	if n := d2.RestoreHistory(HistoryFine, store.rows[HistoryFine]); n != 25 {
		t.Errorf("restored %d 1 s rows", n)
	}
	if n := d2.RestoreHistory(HistoryCoarse, store.rows[HistoryCoarse]); n != 3 {
		t.Errorf("restored %d 10 s rows", n)
	}
	if n := d2.RestoreHistory("5s", store.rows[HistoryFine]); n != 0 {
		t.Errorf("an unknown resolution took %d rows", n)
	}
	get := func(d *Dashboard, q string) (int, string) {
		rec := httptest.NewRecorder()
		d.historyHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/status/history"+q, nil))
		return rec.Code, rec.Body.String()
	}
	for _, q := range []string{"", "?resolution=1s", "?resolution=10s", "?resolution=10s&since=1764496805000"} {
		_, want := get(d, q)
		if code, got := get(d2, q); code != http.StatusOK || got != want {
			t.Errorf("GET /status/history%s after the restart: %d\n%s\nwant\n%s", q, code, got, want)
		}
	}
	if code, _ := get(d2, "?resolution=1m"); code != http.StatusBadRequest {
		t.Errorf("resolution=1m: %d, want 400", code)
	}
	doc := decodeHistory(t, d2.Coarse(), 0)
	if len(doc.T) != 3 || doc.T[1]-doc.T[0] != 10 || show(doc.Backends[0].RequestRate) != "[- 7 7]" {
		t.Errorf("coarse ring: t %v, request_rate %s", doc.T, show(doc.Backends[0].RequestRate))
	}
	// The coarse ring goes on 10 s after the last restored sample.
	d2.Sample(t0.Add(25 * time.Second))
	d2.Sample(t0.Add(30 * time.Second))
	if doc := decodeHistory(t, d2.Coarse(), 0); len(doc.T) != 4 || doc.T[3] != float64(t0.Unix()+30) {
		t.Errorf("coarse ring after the restart: t %v", doc.T)
	}
}
