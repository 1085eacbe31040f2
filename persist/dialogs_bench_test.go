package persist

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// dirBytes is the size of the files under dir.
func dirBytes(dir string) int64 {
	var n int64
	filepath.WalkDir(dir, func(_ string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}

// cpuTicks is the user+system CPU time of pid in clock ticks (1/100 s).
func cpuTicks(pid int) int64 {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+2:]))
	u, _ := strconv.ParseInt(f[11], 10, 64)
	s, _ := strconv.ParseInt(f[12], 10, 64)
	return u + s
}

// selfCPU is the user+system CPU time of this process (the balancer's
// side: queueing, encoding, the pump's write), which is steadier on a
// shared machine than the wall time of ns/op.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkPutDialogs writes dialog records through the store process in
// batches of 1000 (what the SIP side hands over per flush at 10,000
// calls/s and a 100 ms batch), as a dialog table writes through; it
// reports records/s, the bytes the database holds per dialog (write-ahead
// log, value log and tables), and the store process's CPU and the
// balancer's (this process's) per 10,000.
func BenchmarkPutDialogs(b *testing.B) {
	dir := b.TempDir()
	cfg := cfg3(dir)
	cfg.QueueMax = 1 << 20
	s, err := Open(cfg, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close(bg)
	s.rc.mu.Lock()
	pid := s.rc.proc.Pid
	s.rc.mu.Unlock()
	base := dirBytes(filepath.Join(dir, db3Dir))
	cpu0, self0 := cpuTicks(pid), selfCPU()
	exp := time.Now().Add(time.Hour)
	const batch = 1000
	recs := make([]DialogRecord, batch)
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	n := 0
	for i := 0; i < b.N; i += batch {
		for j := range recs {
			recs[j] = DialogRecord{Key: uint64(i + j), Backend: "sip/10.0.0.7:5060", ToTag: uint32(j), Src: 7, Expires: exp}
		}
		s.PutDialogs(recs)
		recs = make([]DialogRecord, batch)
		if err := s.Flush(); err != nil {
			b.Fatal(err)
		}
		n += batch
	}
	el := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(n)/el.Seconds(), "records/s")
	b.ReportMetric(float64(dirBytes(filepath.Join(dir, db3Dir))-base)/float64(n), "disk-B/dialog")
	b.ReportMetric(float64(cpuTicks(pid)-cpu0)*10/float64(n)*10_000, "child-cpu-ms/10k")
	b.ReportMetric(float64(selfCPU()-self0)/1e6/float64(n)*10_000, "cpu-ms/10k")
}

// BenchmarkDialogCalls writes what the SIP dialog table hands over for
// calls at 10,000 calls/s: a batch every 100 ms (1000 calls), each call
// two records (its INVITE, 2xx and ACK coalesced into one put; its BYE's
// linger a second put of the same key, in a later batch) and no delete
// (entries expire by TTL). One op is one call. It reports the batches a
// second the store process can take (10 are needed), the bytes on disk
// per call, and the store process's CPU and the balancer's (this
// process's) per 10,000 calls (that is, per second at 10,000 calls/s).
func BenchmarkDialogCalls(b *testing.B) {
	dir := b.TempDir()
	cfg := cfg3(dir)
	cfg.QueueMax = 1 << 20
	s, err := Open(cfg, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close(bg)
	s.rc.mu.Lock()
	pid := s.rc.proc.Pid
	s.rc.mu.Unlock()
	base := dirBytes(filepath.Join(dir, db3Dir))
	cpu0, self0 := cpuTicks(pid), selfCPU()
	const perBatch = 1000 // calls in 100 ms at 10,000/s
	now := time.Now()
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	calls, batches := 0, 0
	for calls < b.N {
		recs := make([]DialogRecord, 0, 2*perBatch)
		for j := range perBatch {
			k := uint64(calls + j + 1)
			recs = append(recs, DialogRecord{Key: k, Backend: "sip/10.0.0.7:5060", ToTag: uint32(k), Src: 7, Expires: now.Add(time.Hour)})
			if k > perBatch { // the BYE of a call of the batch before
				recs = append(recs, DialogRecord{Key: k - perBatch, Backend: "sip/10.0.0.7:5060", ToTag: uint32(k), Src: 7, Linger: true, Expires: now.Add(32 * time.Second)})
			}
		}
		s.PutDialogs(recs)
		if err := s.Flush(); err != nil {
			b.Fatal(err)
		}
		calls += perBatch
		batches++
	}
	el := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(batches)/el.Seconds(), "batches/s")
	b.ReportMetric(float64(dirBytes(filepath.Join(dir, db3Dir))-base)/float64(calls), "disk-B/call")
	b.ReportMetric(float64(cpuTicks(pid)-cpu0)*10/float64(calls)*10_000, "child-cpu-ms/10k-calls")
	b.ReportMetric(float64(selfCPU()-self0)/1e6/float64(calls)*10_000, "cpu-ms/10k-calls")
}
