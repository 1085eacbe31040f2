package cluster

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sluicelb/sluice/admission"
)

// The cost of the cluster, measured against a real redis-server on
// loopback. Run:
//
//	go test -run '^$' -bench . -benchtime 1x ./cluster          (cost table)
//	go test -run '^$' -bench Decide -benchmem ./cluster         (decision path)

// benchNode is one in-process node: a Controller whose rules spend leases.
type benchNode struct {
	ctl *admission.Controller
	c   *Cluster
}

func newBenchNode(b testing.TB, url, name string, limit int64) *benchNode {
	clock := admission.MonoClock{}
	ctl, err := admission.NewController(admission.ControllerConfig{Rules: []admission.RuleConfig{
		{Name: "invites", Limit: limit, Unit: time.Second, Action: admission.ActionReject},
	}}, nil, clock.Now())
	if err != nil {
		b.Fatal(err)
	}
	rdb, err := NewClient(url, DefaultConfig().Timeout)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { rdb.Close() })
	c, err := New(Config{Redis: url, Name: "bench", Node: name}, rdb, clock, nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	c.AttachRules(ctl.Rules())
	return &benchNode{ctl: ctl, c: c}
}

func (n *benchNode) start(b testing.TB) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{}, 2)
	go func() { n.ctl.Run(ctx, admission.MonoClock{}, 5*time.Millisecond); done <- struct{}{} }()
	go func() { n.c.Run(ctx); done <- struct{}{} }()
	b.Cleanup(func() { cancel(); <-done; <-done })
	for i := 0; i < 200 && !n.c.Up(); i++ {
		time.Sleep(5 * time.Millisecond)
	}
}

func benchRedis(b testing.TB) string {
	port := freePort(b)
	startRedis(b, port)
	return fmt.Sprintf("redis://127.0.0.1:%d/0", port)
}

// BenchmarkDecideLocal is the decision path of a standalone node with one
// ARM rule whose limit is never reached: the reference.
func BenchmarkDecideLocal(b *testing.B) {
	clock := admission.MonoClock{}
	ctl, _ := admission.NewController(admission.ControllerConfig{Rules: []admission.RuleConfig{
		{Name: "invites", Limit: 1<<31 - 1, Unit: time.Second, Action: admission.ActionReject},
	}}, nil, clock.Now())
	r := &admission.Request{Proto: "sip", Method: "INVITE"}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			ctl.Decide(clock.Now(), r, nil)
		}
	})
}

// BenchmarkDecideCluster is the same decision with the rule's budget leased
// from Redis on loopback (leases sized by the arrival rate, round trips in
// the background). It reports Redis round trips per decision.
func BenchmarkDecideCluster(b *testing.B) {
	n := newBenchNode(b, benchRedis(b), "a", 1<<31-1)
	n.start(b)
	clock := admission.MonoClock{}
	r := &admission.Request{Proto: "sip", Method: "INVITE"}
	rt0 := n.c.RoundTrips()
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			ctl := n.ctl
			ctl.Decide(clock.Now(), r, nil)
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(n.c.RoundTrips()-rt0)/float64(b.N), "roundtrips/op")
}

// BenchmarkClusterCost drives three nodes sharing a limit for two seconds
// per iteration at 300, 3,000 and 30,000 admitted/s (demand 90 % of the
// limit, spread evenly) and reports Redis round trips per second per node,
// admissions per round trip, and the added p99 latency of admitted
// decisions against a standalone meter at the same load.
func BenchmarkClusterCost(b *testing.B) {
	url := benchRedis(b)
	for _, limit := range []int64{300, 3000, 30000} {
		b.Run(fmt.Sprintf("admitted=%d", limit), func(b *testing.B) {
			for range b.N {
				var nodes []*benchNode
				for i := range 3 {
					n := newBenchNode(b, url, fmt.Sprintf("c%d-%d", limit, i), limit)
					n.start(b)
					nodes = append(nodes, n)
				}
				local := newBenchNode(b, url, "local", limit)
				local.ctl.Rules()[0].SetLease(nil) // standalone meter, same load
				rt0 := make([]uint64, 3)
				for i, n := range nodes {
					rt0[i] = n.c.RoundTrips()
				}
				dur := 2 * time.Second
				var wg sync.WaitGroup
				lat := make([][]time.Duration, 4)
				adm := make([]int64, 4)
				for i, n := range append(nodes, local) {
					wg.Add(1)
					go func() {
						defer wg.Done()
						lat[i], adm[i] = drive(n.ctl, float64(limit)*0.9/3, dur)
					}()
				}
				wg.Wait()
				var rts float64
				for i, n := range nodes {
					rts += float64(n.c.RoundTrips() - rt0[i])
				}
				var clusterLat []time.Duration
				for i := range 3 {
					clusterLat = append(clusterLat, lat[i]...)
				}
				p99c, p99l := p99(clusterLat), p99(lat[3])
				admitted := float64(adm[0]+adm[1]+adm[2]) / dur.Seconds()
				b.ReportMetric(admitted, "admitted/s")
				b.ReportMetric(rts/dur.Seconds()/3, "roundtrips/s/node")
				b.ReportMetric(float64(adm[0]+adm[1]+adm[2])/rts, "admitted/roundtrip")
				b.ReportMetric(float64(p99c-p99l)/1e3, "p99-added-µs")
			}
		})
	}
}

// drive decides rate new requests per second for dur, paced in 1ms steps,
// and returns the latency of each admitted decision and how many there were.
func drive(ctl *admission.Controller, rate float64, dur time.Duration) ([]time.Duration, int64) {
	clock := admission.MonoClock{}
	r := &admission.Request{Proto: "sip", Method: "INVITE"}
	var lat []time.Duration
	var adm int64
	var acc float64
	t := time.NewTicker(time.Millisecond)
	defer t.Stop()
	start := time.Now()
	last := start
	for time.Since(start) < dur {
		<-t.C
		now := time.Now()
		acc += rate * now.Sub(last).Seconds()
		last = now
		for ; acc >= 1; acc-- {
			t0 := time.Now()
			if ctl.Decide(clock.Now(), r, nil).Verdict == admission.Admit {
				lat = append(lat, time.Since(t0))
				adm++
			}
		}
	}
	return lat, adm
}

func p99(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	slices.Sort(d)
	return d[len(d)*99/100]
}
