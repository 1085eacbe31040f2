// Command overload measures overload without loss: new work at a multiple
// of the learned capacity while sticky HTTP sessions and SIP dialogs keep
// sending, all through a `sluice run` child process on loopback.
//
// It starts two demo HTTP backends and two demo SIP UASes in this process
// (each live session or dialog holds real memory and is reported on
// /metrics), starts the given sluice binary in front of them, establishes
// the sticky sessions and dialogs, offers new work above the backends'
// safe rate until MOP shows every backend learned (bounded), then offers
// -factor times the learned rate for -duration. Every second it prints a
// row: backend memory, new work sent/admitted/refused, affinity
// sent/succeeded, MOP's allowed rates, the balancer's RSS and goroutines.
// It exits 1 when a property fails:
//
//   - a sticky HTTP request or an in-dialog SIP transaction failed;
//   - a backend's memory passed -max-heap + 2 points;
//   - a refusal lacked Retry-After, or new work got no answer at all;
//   - the balancer's goroutines or RSS at the end of the overload were not
//     below 2 × their value at its start plus a slack;
//
// and 2 when the scenario could not be carried out.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	cfg := defaultConfig()
	flag.StringVar(&cfg.Sluice, "sluice", "", "path of the sluice binary (required)")
	flag.IntVar(&cfg.Sessions, "sessions", cfg.Sessions, "sticky HTTP sessions kept alive")
	flag.IntVar(&cfg.Dialogs, "dialogs", cfg.Dialogs, "SIP dialogs kept alive")
	flag.DurationVar(&cfg.Duration, "duration", cfg.Duration, "length of the overload phase")
	flag.Float64Var(&cfg.Factor, "factor", cfg.Factor, "new work offered, times the learned rate")
	flag.DurationVar(&cfg.Lifetime, "lifetime", cfg.Lifetime, "memory lifetime of a new HTTP session; length of a new call")
	flag.IntVar(&cfg.SessionBytes, "session-bytes", cfg.SessionBytes, "memory a session or dialog holds in its backend")
	flag.Int64Var(&cfg.BackendMax, "backend-max", cfg.BackendMax, "each backend's maximum memory, bytes")
	flag.Float64Var(&cfg.MaxHeap, "max-heap", cfg.MaxHeap, "sluice -mop-max-heap (fraction)")
	flag.DurationVar(&cfg.Window, "window", cfg.Window, "sluice -mop-window")
	flag.DurationVar(&cfg.Probe, "probe", cfg.Probe, "sluice -mop-probe-interval")
	flag.DurationVar(&cfg.Interval, "interval", cfg.Interval, "request period of a sticky session")
	flag.DurationVar(&cfg.DialogInterval, "dialog-interval", cfg.DialogInterval, "re-INVITE period of a dialog")
	flag.DurationVar(&cfg.SetupTimeout, "setup-timeout", cfg.SetupTimeout, "bound on establishing the sessions and dialogs")
	flag.DurationVar(&cfg.LearnTimeout, "learn-timeout", cfg.LearnTimeout, "bound on the learning phase")
	flag.StringVar(&cfg.Dir, "dir", "", "work directory for sluice's data and log (default: a new temporary one)")
	flag.Parse()
	if cfg.Sluice == "" {
		fmt.Fprintln(os.Stderr, "overload: -sluice PATH is required (bench/overload.sh builds it)")
		os.Exit(2)
	}
	if cfg.Dir == "" {
		d, err := os.MkdirTemp("", "sluice-overload-")
		if err != nil {
			fmt.Fprintln(os.Stderr, "overload:", err)
			os.Exit(2)
		}
		cfg.Dir = d
	}
	cfg.Out = os.Stdout
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer cancel()
	fmt.Printf("overload: %d sticky sessions, %d dialogs, %v at %.0f× the learned rate; work directory %s\n",
		cfg.Sessions, cfg.Dialogs, cfg.Duration, cfg.Factor, cfg.Dir)
	rep, err := run(ctx, cfg)
	if rep != nil {
		rep.print(os.Stdout)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "overload: scenario not carried out:", err, "(sluice log:", cfg.Dir+"/sluice.log)")
		os.Exit(2)
	}
	if len(rep.verdict()) > 0 {
		os.Exit(1)
	}
}

// defaultConfig is the full scenario: 1,000 sessions and 1,000 dialogs,
// 60 s at 5×. Each backend holds 64 KiB per session against 64 MiB, so the
// kept sessions (500 a backend) fill half of it and MOP's ceiling leaves
// room for about 11 new sessions a second per backend.
func defaultConfig() config {
	return config{
		Sessions: 1000, Dialogs: 1000,
		Duration: 60 * time.Second, Factor: 5,
		Lifetime: 30 * time.Second, SessionBytes: 64 << 10, BackendMax: 64 << 20,
		MaxHeap: 0.85, Window: 30 * time.Second, Probe: time.Second, InitialRate: 5,
		Interval: time.Second, DialogInterval: 2 * time.Second,
		SetupTimeout: 90 * time.Second, LearnTimeout: 4 * time.Minute, LearnFactor: 3,
		Concurrency:    512,
		GoroutineSlack: 100, RSSSlack: 32 << 20,
	}
}
