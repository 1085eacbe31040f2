package admin

import (
	"bytes"
	"encoding/json"
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/sluicelb/sluice/admission"
)

// History limits. Memory is fixed at construction for the node-wide
// columns (29 bytes a sample: time, memory state and use, four refusal
// rates); each backend (25 bytes a sample) or ARM rule (12) gets its
// columns, capacity entries each, when first sampled, up to these counts.
// So the ring never grows past capacity × (29 + 25×64 + 12×32) bytes, about
// 1.8 MB at the default 900 samples. The demo's four backends and no rules
// take 129 bytes a sample: 113 KiB for 15 minutes.
const (
	// DefaultHistorySamples is 15 minutes at one sample a second.
	DefaultHistorySamples = 900
	// MaxHistoryBackends is the most backends whose series are kept;
	// later ones are left out of the history (they stay in /status).
	MaxHistoryBackends = 64
	// MaxHistoryRules is the most ARM rules whose series are kept.
	MaxHistoryRules = 32
)

// memStateNames are the node memory states by their index in the history.
var memStateNames = []string{"normal", "low", "lower", "critical"}

// noState marks a sample without a state (a backend not yet present).
const noState = 255

// History is a fixed-size ring of compact samples of the Status document
// and the refusal counters, one per Record call (a second apart in
// production). Rates are derived from the counters of consecutive samples.
// It is safe for concurrent use: Record and WriteJSON take a mutex, which is
// fine on the admin listener's slow path.
type History struct {
	mu       sync.Mutex
	capacity int
	n        int   // samples held
	next     int   // ring index of the next write
	seq      int64 // samples recorded since start

	maxHeapPercent float64 // MOP ceiling drawn on the memory plots; 0 for none
	interval       float64 // seconds between samples, for the JSON document

	t        []int64 // unix milliseconds
	memState []uint8
	memUsed  []float32 // bytes
	memLimit int64     // last sampled limit
	refused  [][]float32
	reasons  []string

	backends   []*backendSeries
	byKey      map[string]*backendSeries
	rules      []*ruleSeries
	byRule     map[string]*ruleSeries
	prevT      time.Time
	prevRefuse []uint64
}

// backendSeries is one backend's columns; key is protocol/id.
type backendSeries struct {
	key, id, proto string
	lastSeq        int64
	state          []uint8
	newRate        []float32 // MOP-admitted new work per second (NaN without MOP)
	reqRate        []float32 // forwarded requests per second, all classes
	allowed        []float32
	learned        []float32
	memPct         []float32
	outstanding    []float32
	prevAdmitted   uint64
	prevRequests   uint64
	prevSeq        int64 // seq of the prev* counters; -1 for none
}

// ruleSeries is one ARM rule's columns.
type ruleSeries struct {
	name    string
	lastSeq int64
	rate    []float32
	limit   []float32
	queued  []float32
}

// NewHistory returns a ring of capacity samples (DefaultHistorySamples
// when capacity <= 0).
func NewHistory(capacity int) *History {
	if capacity <= 0 {
		capacity = DefaultHistorySamples
	}
	h := &History{
		capacity: capacity,
		t:        make([]int64, capacity),
		memState: make([]uint8, capacity),
		memUsed:  make([]float32, capacity),
		byKey:    map[string]*backendSeries{},
		byRule:   map[string]*ruleSeries{},
	}
	for _, r := range admission.ReasonNames {
		if r != "" {
			h.reasons = append(h.reasons, r)
			h.refused = append(h.refused, make([]float32, capacity))
		}
	}
	h.prevRefuse = make([]uint64, len(h.reasons))
	return h
}

// Capacity returns the number of samples the ring holds.
func (h *History) Capacity() int { return h.capacity }

// Len returns the number of samples held.
func (h *History) Len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.n
}

// BytesPerSample is the memory one sample takes now, with the backends and
// rules seen so far.
func (h *History) BytesPerSample() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return 8 + 1 + 4 + 4*len(h.reasons) + 25*len(h.backends) + 12*len(h.rules)
}

func nan() float32 { return float32(math.NaN()) }

// rate is (cur-prev)/dt, NaN when there is no previous value or the counter
// went backwards (a replaced backend).
func rate(cur, prev uint64, havePrev bool, dt float64) float32 {
	if !havePrev || dt <= 0 || cur < prev {
		return nan()
	}
	return float32(float64(cur-prev) / dt)
}

// Record adds a sample taken at now from st and the controller's counts
// (nil when there is no controller). The oldest sample is overwritten
// once the ring is full.
func (h *History) Record(now time.Time, st Status, counts *admission.Counts) {
	h.mu.Lock()
	defer h.mu.Unlock()
	i := h.next
	dt := 0.0
	if !h.prevT.IsZero() {
		dt = now.Sub(h.prevT).Seconds()
	}
	havePrev := !h.prevT.IsZero()
	h.prevT = now
	h.t[i] = now.UnixMilli()
	h.memState[i] = noState
	for k, name := range memStateNames {
		if st.MemoryState == name {
			h.memState[i] = uint8(k)
		}
	}
	h.memUsed[i] = float32(st.Memory.UsedBytes)
	h.memLimit = st.Memory.LimitBytes

	for r, name := range h.reasons {
		var total uint64
		if counts != nil {
			for p := range counts.Refused {
				for k, rn := range admission.ReasonNames {
					if rn == name {
						total += counts.Refused[p][k]
					}
				}
			}
		}
		h.refused[r][i] = rate(total, h.prevRefuse[r], havePrev && counts != nil, dt)
		h.prevRefuse[r] = total
	}

	for _, b := range h.backends {
		b.clear(i)
	}
	for _, bs := range st.Backends {
		b := h.backend(bs)
		if b == nil {
			continue
		}
		b.lastSeq = h.seq
		b.state[i] = backendStateIndex(bs.State)
		prev := b.prevSeq == h.seq-1
		if bs.MOP.Enabled {
			b.newRate[i] = rate(bs.MOP.Admitted, b.prevAdmitted, prev, dt)
			b.allowed[i] = float32(bs.MOP.AllowedRate)
			b.learned[i] = float32(bs.MOP.LearnedRate)
			b.memPct[i] = float32(bs.MOP.MemoryPercent)
		}
		b.reqRate[i] = rate(bs.Requests, b.prevRequests, prev, dt)
		b.outstanding[i] = float32(bs.Outstanding)
		b.prevAdmitted, b.prevRequests, b.prevSeq = bs.MOP.Admitted, bs.Requests, h.seq
	}

	for _, r := range h.rules {
		r.limit[i], r.rate[i], r.queued[i] = nan(), nan(), nan()
	}
	for _, rs := range st.ARM {
		r := h.rule(rs.Name)
		if r == nil {
			continue
		}
		r.lastSeq = h.seq
		r.rate[i], r.limit[i], r.queued[i] = float32(rs.Rate), float32(rs.Limit), float32(rs.Queued)
	}

	h.seq++
	h.next = (h.next + 1) % h.capacity
	if h.n < h.capacity {
		h.n++
	}
	h.expire()
}

func (b *backendSeries) clear(i int) {
	b.state[i] = noState
	for _, c := range [][]float32{b.newRate, b.reqRate, b.allowed, b.learned, b.memPct, b.outstanding} {
		c[i] = nan()
	}
}

// backend returns the series of bs, created on first sight; nil past
// MaxHistoryBackends.
func (h *History) backend(bs BackendStatus) *backendSeries {
	key := bs.Protocol + "/" + bs.ID
	if b := h.byKey[key]; b != nil {
		return b
	}
	if len(h.backends) >= MaxHistoryBackends {
		return nil
	}
	c := h.capacity
	b := &backendSeries{key: key, id: bs.ID, proto: bs.Protocol, prevSeq: -1,
		state: make([]uint8, c), newRate: make([]float32, c), reqRate: make([]float32, c), allowed: make([]float32, c),
		learned: make([]float32, c), memPct: make([]float32, c), outstanding: make([]float32, c)}
	for i := range c {
		b.clear(i)
	}
	h.backends = append(h.backends, b)
	h.byKey[key] = b
	return b
}

func (h *History) rule(name string) *ruleSeries {
	if r := h.byRule[name]; r != nil {
		return r
	}
	if len(h.rules) >= MaxHistoryRules {
		return nil
	}
	c := h.capacity
	r := &ruleSeries{name: name, rate: make([]float32, c), limit: make([]float32, c), queued: make([]float32, c)}
	for i := range c {
		r.rate[i], r.limit[i], r.queued[i] = nan(), nan(), nan()
	}
	h.rules = append(h.rules, r)
	h.byRule[name] = r
	return r
}

// expire drops the series of backends and rules absent from every sample
// the ring still holds (removed by a reload long enough ago).
func (h *History) expire() {
	oldest := h.seq - int64(h.n)
	keep := h.backends[:0]
	for _, b := range h.backends {
		if b.lastSeq >= oldest {
			keep = append(keep, b)
		} else {
			delete(h.byKey, b.key)
		}
	}
	clear(h.backends[len(keep):])
	h.backends = keep
	keepR := h.rules[:0]
	for _, r := range h.rules {
		if r.lastSeq >= oldest {
			keepR = append(keepR, r)
		} else {
			delete(h.byRule, r.name)
		}
	}
	clear(h.rules[len(keepR):])
	h.rules = keepR
}

func backendStateIndex(s string) uint8 {
	for k, name := range backendStateNames {
		if s == name {
			return uint8(k)
		}
	}
	return noState
}

// backendStateNames are the backend states by their index in the history.
var backendStateNames = []string{"up", "draining", "down"}

// WriteJSON appends the samples taken after sinceMillis (unix ms; 0 for
// all) to buf as the columnar JSON document of GET /status/history: one
// array per series, index-aligned with "t" (unix seconds, fractional), null
// where a series has no value. Columns suit uPlot's data layout directly.
func (h *History) WriteJSON(buf *bytes.Buffer, sinceMillis int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	// Index range, oldest first, of the samples after sinceMillis.
	idx := make([]int, 0, h.n)
	for k := 0; k < h.n; k++ {
		i := (h.next - h.n + k + h.capacity) % h.capacity
		if h.t[i] > sinceMillis {
			idx = append(idx, i)
		}
	}
	b := buf.AvailableBuffer()
	b = append(b, `{"interval_seconds":`...)
	b = strconv.AppendFloat(b, max(h.interval, 1), 'g', -1, 64)
	b = append(b, `,"capacity":`...)
	b = strconv.AppendInt(b, int64(h.capacity), 10)
	b = append(b, `,"mop_max_heap_percent":`...)
	b = strconv.AppendFloat(b, h.maxHeapPercent, 'g', -1, 64)
	b = append(b, `,"t":[`...)
	for k, i := range idx {
		if k > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendFloat(b, float64(h.t[i])/1000, 'f', 3, 64)
	}
	b = append(b, `],"memory":{"states":`...)
	b = appendNames(b, memStateNames)
	b = append(b, `,"limit_bytes":`...)
	b = strconv.AppendInt(b, h.memLimit, 10)
	b = append(b, `,"state":`...)
	b = appendStates(b, h.memState, idx)
	b = append(b, `,"used_bytes":`...)
	b = appendFloats(b, h.memUsed, idx)
	b = append(b, `},"refused":{`...)
	for r, name := range h.reasons {
		if r > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendQuote(b, name)
		b = append(b, ':')
		b = appendFloats(b, h.refused[r], idx)
	}
	b = append(b, `},"backend_states":`...)
	b = appendNames(b, backendStateNames)
	b = append(b, `,"backends":[`...)
	for k, s := range h.backends {
		if k > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"id":`...)
		b = strconv.AppendQuote(b, s.id)
		b = append(b, `,"protocol":`...)
		b = strconv.AppendQuote(b, s.proto)
		b = append(b, `,"state":`...)
		b = appendStates(b, s.state, idx)
		for _, c := range []struct {
			name string
			col  []float32
		}{{"new_rate", s.newRate}, {"request_rate", s.reqRate}, {"allowed_rate", s.allowed}, {"learned_rate", s.learned},
			{"memory_percent", s.memPct}, {"outstanding", s.outstanding}} {
			b = append(b, ",\""+c.name+"\":"...)
			b = appendFloats(b, c.col, idx)
		}
		b = append(b, '}')
	}
	b = append(b, `],"arm":[`...)
	for k, r := range h.rules {
		if k > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"name":`...)
		b = strconv.AppendQuote(b, r.name)
		b = append(b, `,"rate":`...)
		b = appendFloats(b, r.rate, idx)
		b = append(b, `,"limit":`...)
		b = appendFloats(b, r.limit, idx)
		b = append(b, `,"queued":`...)
		b = appendFloats(b, r.queued, idx)
		b = append(b, '}')
	}
	b = append(b, "]}\n"...)
	buf.Write(b)
}

func appendNames(b []byte, names []string) []byte {
	b = append(b, '[')
	for k, n := range names {
		if k > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendQuote(b, n)
	}
	return append(b, ']')
}

func appendFloats(b []byte, col []float32, idx []int) []byte {
	b = append(b, '[')
	for k, i := range idx {
		if k > 0 {
			b = append(b, ',')
		}
		v := col[i]
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			b = append(b, "null"...)
			continue
		}
		b = strconv.AppendFloat(b, float64(v), 'g', 6, 32)
	}
	return append(b, ']')
}

func appendStates(b []byte, col []uint8, idx []int) []byte {
	b = append(b, '[')
	for k, i := range idx {
		if k > 0 {
			b = append(b, ',')
		}
		if col[i] == noState {
			b = append(b, "null"...)
			continue
		}
		b = strconv.AppendUint(b, uint64(col[i]), 10)
	}
	return append(b, ']')
}

// The history across restarts. The dashboard keeps two rings: the fine
// one (HistoryFine, a sample a second, 15 minutes) the plots draw, and a
// coarse one (HistoryCoarse, a sample every 10 s, 24 h by default) served
// by GET /status/history?resolution=10s. With DashboardConfig.Store set,
// every sample of either is handed to the store as it is recorded (one
// encoded row, historyRow), and RestoreHistory puts the rows a store kept
// back into the rings at start: the plots show what was learned before
// a restart, kill -9 included (less the samples the store had not
// written yet).

// Resolutions of the dashboard's history, as the store names them.
const (
	HistoryFine   = "1s"
	HistoryCoarse = "10s"
)

const (
	// DefaultCoarseSamples is 24 hours at one sample every 10 s.
	DefaultCoarseSamples = 8640
	// MaxCoarseSamples bounds the coarse ring (7 days at 10 s): its
	// memory is about MaxCoarseSamples × 2 KB at the most backends and
	// rules a ring keeps.
	MaxCoarseSamples = 7 * DefaultCoarseSamples
	// coarseEvery is how many fine samples one coarse one stands for.
	coarseEvery = 10
)

// HistoryStore keeps the dashboard's samples across restarts.
// SaveHistory is called on the sampler's goroutine once a second: it must
// only queue the row, never wait on a disk.
type HistoryStore interface {
	SaveHistory(resolution string, at time.Time, row []byte)
}

// historyRow is one sample as stored: JSON, NaN (no value) as null.
type historyRow struct {
	T        int64          `json:"t"` // unix milliseconds
	MemState uint8          `json:"ms"`
	MemUsed  f32            `json:"mu"`
	MemLimit int64          `json:"ml,omitempty"`
	Refused  map[string]f32 `json:"r,omitempty"`
	Backends []backendRow   `json:"b,omitempty"`
	Rules    []ruleRow      `json:"a,omitempty"`
}

type backendRow struct {
	ID      string `json:"id"`
	Proto   string `json:"p"`
	State   uint8  `json:"s"`
	New     f32    `json:"n"`
	Req     f32    `json:"q"`
	Allowed f32    `json:"al"`
	Learned f32    `json:"le"`
	MemPct  f32    `json:"m"`
	Out     f32    `json:"o"`
}

type ruleRow struct {
	Name   string `json:"n"`
	Rate   f32    `json:"r"`
	Limit  f32    `json:"l"`
	Queued f32    `json:"q"`
}

// f32 is a float32 that is null in JSON when it is NaN or infinite.
type f32 float32

func (f f32) MarshalJSON() ([]byte, error) {
	if v := float64(f); math.IsNaN(v) || math.IsInf(v, 0) {
		return []byte("null"), nil
	}
	return strconv.AppendFloat(nil, float64(f), 'g', 6, 32), nil
}

func (f *f32) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		*f = f32(math.NaN())
		return nil
	}
	v, err := strconv.ParseFloat(string(b), 32)
	if err != nil {
		return err
	}
	*f = f32(v)
	return nil
}

// EncodeLast returns the time and the stored form of the newest sample;
// ok is false when there is none.
func (h *History) EncodeLast() (at time.Time, row []byte, ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.n == 0 {
		return time.Time{}, nil, false
	}
	i := (h.next - 1 + h.capacity) % h.capacity
	r := historyRow{T: h.t[i], MemState: h.memState[i], MemUsed: f32(h.memUsed[i]), MemLimit: h.memLimit}
	for k, name := range h.reasons {
		if v := h.refused[k][i]; !math.IsNaN(float64(v)) {
			if r.Refused == nil {
				r.Refused = map[string]f32{}
			}
			r.Refused[name] = f32(v)
		}
	}
	for _, b := range h.backends {
		if b.lastSeq != h.seq-1 {
			continue // not in this sample
		}
		r.Backends = append(r.Backends, backendRow{ID: b.id, Proto: b.proto, State: b.state[i], New: f32(b.newRate[i]),
			Req: f32(b.reqRate[i]), Allowed: f32(b.allowed[i]), Learned: f32(b.learned[i]), MemPct: f32(b.memPct[i]), Out: f32(b.outstanding[i])})
	}
	for _, s := range h.rules {
		if s.lastSeq != h.seq-1 {
			continue
		}
		r.Rules = append(r.Rules, ruleRow{Name: s.name, Rate: f32(s.rate[i]), Limit: f32(s.limit[i]), Queued: f32(s.queued[i])})
	}
	data, err := json.Marshal(r)
	if err != nil {
		return time.Time{}, nil, false
	}
	return time.UnixMilli(h.t[i]), data, true
}

// maxRestoreAhead is how far after the wall clock a restored sample may
// be dated (clocks of one host agree to well within it).
const maxRestoreAhead = time.Minute

// Restore adds stored samples (EncodeLast's rows) to the ring, oldest
// first, and returns how many it took. A row that does not decode, is
// not newer than the newest sample held, is dated more than
// maxRestoreAhead after the wall clock (a damaged store: it would stop
// the page and the coarse ring until that date) or holds an unknown
// state is left out; backends and rules beyond the ring's bounds are, as by Record.
// Call it before the sampler runs: a live sample's rates are taken
// against the previous live one.
func (h *History) Restore(rows [][]byte) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	taken := 0
	latest := time.Now().Add(maxRestoreAhead).UnixMilli()
	for _, data := range rows {
		var r historyRow
		if json.Unmarshal(data, &r) != nil || r.T <= 0 || r.T > latest {
			continue
		}
		if h.n > 0 && r.T <= h.t[(h.next-1+h.capacity)%h.capacity] {
			continue
		}
		if r.MemState != noState && int(r.MemState) >= len(memStateNames) {
			continue
		}
		i := h.next
		h.t[i], h.memState[i], h.memUsed[i] = r.T, r.MemState, float32(r.MemUsed)
		if r.MemLimit > 0 {
			h.memLimit = r.MemLimit
		}
		for k, name := range h.reasons {
			v, ok := r.Refused[name]
			if !ok {
				v = f32(math.NaN())
			}
			h.refused[k][i] = float32(v)
		}
		for _, b := range h.backends {
			b.clear(i)
		}
		for _, br := range r.Backends {
			if br.State != noState && int(br.State) >= len(backendStateNames) {
				continue
			}
			b := h.backend(BackendStatus{ID: br.ID, Protocol: br.Proto})
			if b == nil {
				continue
			}
			b.lastSeq = h.seq
			b.state[i] = br.State
			b.newRate[i], b.reqRate[i], b.allowed[i] = float32(br.New), float32(br.Req), float32(br.Allowed)
			b.learned[i], b.memPct[i], b.outstanding[i] = float32(br.Learned), float32(br.MemPct), float32(br.Out)
		}
		for _, s := range h.rules {
			s.limit[i], s.rate[i], s.queued[i] = nan(), nan(), nan()
		}
		for _, rr := range r.Rules {
			s := h.rule(rr.Name)
			if s == nil {
				continue
			}
			s.lastSeq = h.seq
			s.rate[i], s.limit[i], s.queued[i] = float32(rr.Rate), float32(rr.Limit), float32(rr.Queued)
		}
		h.seq++
		h.next = (h.next + 1) % h.capacity
		if h.n < h.capacity {
			h.n++
		}
		h.expire()
		taken++
	}
	return taken
}

// Coarse returns the dashboard's 10 s ring.
func (d *Dashboard) Coarse() *History { return d.coarse }

// RestoreHistory puts the rows a store kept for resolution (HistoryFine or
// HistoryCoarse) into that ring, oldest first, before the sampler runs;
// it returns how many it took.
func (d *Dashboard) RestoreHistory(resolution string, rows [][]byte) int {
	switch resolution {
	case HistoryFine:
		return d.hist.Restore(rows)
	case HistoryCoarse:
		n := d.coarse.Restore(rows)
		if n > 0 {
			d.coarse.mu.Lock()
			d.lastCoarse = time.UnixMilli(d.coarse.t[(d.coarse.next-1+d.coarse.capacity)%d.coarse.capacity])
			d.coarse.mu.Unlock()
		}
		return n
	}
	return 0
}

// recordCoarse adds a sample to the coarse ring every coarseEvery
// intervals, and hands the new samples to the store.
func (d *Dashboard) recordCoarse(now time.Time, st Status, counts *admission.Counts) {
	if store := d.cfg.Store; store != nil {
		if at, row, ok := d.hist.EncodeLast(); ok {
			store.SaveHistory(HistoryFine, at, row)
		}
	}
	if !d.lastCoarse.IsZero() && now.Sub(d.lastCoarse) < coarseEvery*d.cfg.Interval {
		return
	}
	d.lastCoarse = now
	d.coarse.Record(now, st, counts)
	if store := d.cfg.Store; store != nil {
		if at, row, ok := d.coarse.EncodeLast(); ok {
			store.SaveHistory(HistoryCoarse, at, row)
		}
	}
}
