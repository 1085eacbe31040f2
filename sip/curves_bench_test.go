package sip

import (
	"fmt"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/sluicelb/sluice/internal/benchcpu"
)

// curveDialogs are the live dialog counts of the cost curves.
var curveDialogs = []int{0, 100_000, 1_000_000}

// curveCallID writes the Call-ID of dialog i into buf.
func curveCallID(buf []byte, i int) []byte {
	buf = append(buf[:0], "call-"...)
	buf = strconv.AppendInt(buf, int64(i), 10)
	return append(buf, "@host.example"...)
}

// fillDialogs returns a table of n live dialogs (Call-ID curveCallID(i),
// From-tag "from-tag", one of eight backends) and the heap in use they
// added after a forced GC, per dialog (0 when n is 0).
func fillDialogs(n int) (*dialogTable, float64) {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	dt := newDialogTable(time.Hour, n+1024)
	ids := [8]string{"b0", "b1", "b2", "b3", "b4", "b5", "b6", "b7"}
	var buf []byte
	for i := range n {
		buf = curveCallID(buf, i)
		if !dt.insert(dt.key(string(buf), "from-tag"), ids[i%len(ids)], 0) {
			panic("dialog table full at " + strconv.Itoa(i))
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(dt)
	if n == 0 {
		return dt, 0
	}
	return dt, float64(int64(after.HeapInuse)-int64(before.HeapInuse)) / float64(n)
}

// BenchmarkCurveDialog is the dialog table's two per-call operations as
// the table grows to 0, 100k and 1M live dialogs: lookup (a token-less
// in-dialog request: hash, shard lock, map hit, refresh) of 64Ki
// dialogs spread through the table, so the map's memory is touched as
// live traffic touches it (n=0: the table holds the one it looks up),
// and insert (an INVITE's dialog recorded, then removed as its failed
// answer does, so the table stays at n). The lookup reports the heap in
// use per live dialog after a forced GC (B/dialog).
func BenchmarkCurveDialog(b *testing.B) {
	for _, n := range curveDialogs {
		b.Run(fmt.Sprintf("lookup/n=%d", n), func(b *testing.B) {
			live := max(n, 1)
			dt, per := fillDialogs(live)
			const sample = 1 << 16
			cids := make([]string, sample)
			for j := range cids {
				// 1,000,003 is prime and coprime with every live count:
				// the sample is spread over the whole table.
				cids[j] = string(curveCallID(nil, int((uint64(j)*1_000_003)%uint64(live))))
			}
			b.ReportAllocs()
			i := 0
			cpu0, ops := benchcpu.Now(), 0
			for b.Loop() {
				ops++
				if _, ok := dt.lookup(cids[i&(sample-1)], "from-tag", "to-tag", 1); !ok {
					b.Fatal("miss")
				}
				i++
			}
			benchcpu.Report(b, cpu0, ops)
			if dt.Len() != live {
				b.Fatalf("%d dialogs after the lookups, want %d", dt.Len(), live)
			}
			if n > 0 {
				b.ReportMetric(per, "B/dialog") // after the loop: b.Loop's first call drops earlier metrics
			}
		})
		b.Run(fmt.Sprintf("insert/n=%d", n), func(b *testing.B) {
			dt, _ := fillDialogs(n)
			var buf []byte
			keys := make([]uint64, 1<<12)
			for j := range keys {
				buf = curveCallID(buf, -1-j)
				keys[j] = dt.key(string(buf), "from-tag")
			}
			b.ReportAllocs()
			i := 0
			cpu0, ops := benchcpu.Now(), 0
			for b.Loop() {
				ops++
				k := keys[i&(len(keys)-1)]
				if !dt.insert(k, "b1", 1) {
					b.Fatal("refused")
				}
				dt.remove(k)
				i++
			}
			benchcpu.Report(b, cpu0, ops)
			if dt.Len() != n {
				b.Fatalf("%d dialogs after the inserts, want %d", dt.Len(), n)
			}
		})
	}
}
