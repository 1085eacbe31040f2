package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sluicelb/sluice/admission"
)

func init() {
	register("simulate", "replay arrivals through one ARM rule, or a backend model through MOP (--mop), offline", runSimulate)
}

// simRow is one interval as printed with --json.
type simRow struct {
	Interval int    `json:"interval"`
	Start    string `json:"start"`
	Arrived  int    `json:"arrived"`
	Admitted int    `json:"admitted"`
	Released int    `json:"released"`
	Refused  int    `json:"refused"`
	Rate     int64  `json:"rate"`
	Queued   int64  `json:"queued"`
}

func runSimulate(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("simulate", stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: sluice simulate --limit N/UNIT --arrivals A1,A2,... [--queue 1000] [--action delay|reject|log] [--qualify 0s] [--wait 0s] [--json]")
		fmt.Fprintln(stderr, "\nReplays arrivals, given per sub-interval (a sixth of UNIT), through one ARM rule and prints")
		fmt.Fprintln(stderr, "interval, start, arrived, admitted, released, refused, rate and queued.")
		fmt.Fprintln(stderr, "\n   or: sluice simulate --mop base=SIZE|PCT%,bytes=SIZE,lifetime=DUR,max-heap=SIZE,rate=N[,KEY=VALUE...] [--json]")
		fmt.Fprintln(stderr, "\nReplays a backend model through MOP discovery in fake time and prints, per averaging window, the")
		fmt.Fprintln(stderr, "allowed rate, admitted, refused and memory. Keys:")
		fmt.Fprintln(stderr, "  "+strings.ReplaceAll(admission.MOPSimKeys, "\n", "\n  "))
		fmt.Fprintln(stderr, "Example: --mop base=10%,bytes=64KiB,lifetime=30s,max-heap=1GiB,rate=300,window=30s")
		fmt.Fprintln(stderr)
		fs.PrintDefaults()
	}
	limit := fs.String("limit", "", "rule limit as N/UNIT, UNIT one of s, sec, second, m, min, minute, h, hour (required)")
	arrivals := fs.String("arrivals", "", "comma-separated arrivals per sub-interval (required)")
	queue := fs.Int("queue", 1000, "delay queue bound")
	action := fs.String("action", "delay", "what to do over the limit: delay, reject or log")
	qualify := fs.Duration("qualify", 0, "qualification time: how long the rate may stay at the limit before the rule throttles")
	wait := fs.Duration("wait", 0, "longest wait in the delay queue before refusal (0: no bound)")
	asJSON := fs.Bool("json", false, "print a JSON array instead of a table")
	mopSpec := fs.String("mop", "", "replay a backend model through MOP instead (see the keys above)")
	if code, ok := parseCommand("simulate", fs, args, stderr); !ok {
		return code
	}
	bad := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "sluice simulate: "+format+"\n", a...)
		return 2
	}
	if *mopSpec != "" {
		return simulateMOP(*mopSpec, *asJSON, stdout, stderr)
	}
	if *limit == "" {
		return bad("--limit is required, e.g. --limit 10/min")
	}
	n, unit, err := admission.ParseLimit(*limit)
	if err != nil {
		return bad("--limit: %v", err)
	}
	if *arrivals == "" {
		return bad("--arrivals is required, e.g. --arrivals 1,2,2,3")
	}
	var counts []int
	for i, f := range strings.Split(*arrivals, ",") {
		c, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || c < 0 {
			return bad("--arrivals: item %d %q is not a count >= 0", i+1, f)
		}
		counts = append(counts, c)
	}
	act, err := admission.ParseAction(*action)
	if err != nil {
		return bad("--action: %v", err)
	}
	if *queue < 1 {
		return bad("--queue must be >= 1 (got %d)", *queue)
	}
	if *qualify < 0 {
		return bad("--qualify must not be negative")
	}
	if *wait < 0 {
		return bad("--wait must not be negative")
	}
	rc := admission.RuleConfig{Name: "simulated", Limit: n, Unit: unit, Action: act, Queue: *queue, Qualify: *qualify, MaxWait: *wait}
	rows, err := admission.Simulate(rc, counts)
	if err != nil {
		return bad("%v", err)
	}
	if *asJSON {
		out := make([]simRow, len(rows))
		for i, r := range rows {
			out[i] = simRow{r.Interval, r.Start.String(), r.Arrived, r.Admitted, r.Released, r.Refused, r.Rate, r.Queued}
		}
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(out); err != nil {
			fmt.Fprintln(stderr, "sluice simulate:", err)
			return 1
		}
		return 0
	}
	fmt.Fprintf(stdout, "rule: limit %d per %s, %d sub-intervals of %s, action %s, queue %d, qualify %s\n\n",
		n, unit, 6, unit/6, act, *queue, *qualify)
	tw := tabwriter.NewWriter(stdout, 2, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "interval\tstart\tarrived\tadmitted\treleased\trefused\trate\tqueued\t")
	for _, r := range rows {
		fmt.Fprintf(tw, "%d\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t\n", r.Interval, fmtStart(r.Start), r.Arrived, r.Admitted, r.Released, r.Refused, r.Rate, r.Queued)
	}
	if err := tw.Flush(); err != nil {
		return 1
	}
	return 0
}

// fmtStart prints a sub-interval's start as an offset from the first.
func fmtStart(d time.Duration) string { return "+" + d.String() }

// simulateMOP runs `sluice simulate --mop SPEC`.
func simulateMOP(spec string, asJSON bool, stdout, stderr io.Writer) int {
	s, err := admission.ParseMOPSimSpec(spec)
	if err != nil {
		fmt.Fprintf(stderr, "sluice simulate: --mop: %v\n", err)
		return 2
	}
	r, err := admission.RunMOPSim(s)
	if err == nil && asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		err = enc.Encode(r.Windows)
	} else if err == nil {
		err = r.WriteTable(stdout)
	}
	if err != nil {
		fmt.Fprintln(stderr, "sluice simulate:", err)
		return 1
	}
	return 0
}
