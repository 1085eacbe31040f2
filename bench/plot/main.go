// Command plot draws the charts of a benchmark run: it reads the
// results.tsv that ../shared/peers/run.sh wrote for bench/http.sh or
// bench/sip.sh and writes PNGs of sluice next to the peers measured in the
// same run.
//
//	go run ./bench/plot -in "$OUT"            # charts into $OUT
//	go run ./bench/plot -in "$OUT" -out DIR   # charts into DIR
//
// -in is the scripts' OUT directory (results in peers/ for http.sh, sweep/
// for sip.sh) or run.sh's own output directory. Written, as the run has
// the data:
//
//	http.png       req/s per connection count and system
//	http-p99.png   p99 latency per connection count and system
//	http-cpu.png   balancer CPU per request (process CPU / req/s)
//	sip.png        highest clean call rate per system, and balancer CPU
//	               per call at that rate
//
// The same input gives byte-identical files. It prints the paths it wrote.
//
// The curves subcommand draws the in-process cost curves (bench/curves.sh):
//
//	go run ./bench/plot curves -in BENCH_OUTPUT -out bench/img [-tsv FILE] [-md FILE]
//
// reads go test -bench BenchmarkCurve -benchmem output (several -count
// runs), takes the median per point and writes curves-<family>.png (ns
// per operation against size, log x), and the medians as TSV and as a
// Markdown table.
//
// The idlemem subcommand draws bench/idle-mem.sh's memory per idle
// connection against the connection count, one line per leg and system:
//
//	go run ./bench/plot idlemem -in OUT/idle-mem.tsv -out bench/img
//
// The sipcurve subcommand draws bench/sip-cpu.sh curve's SIP cost curves
// (CPU per call against live dialogs and against TCP client connections,
// memory against live dialogs):
//
//	go run ./bench/plot sipcurve -in OUT/curve-summary.tsv -out bench/img
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "curves" {
		if err := curvesMain(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "plot curves:", err)
			os.Exit(2)
		}
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "idlemem" {
		if err := idleMain(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "plot idlemem:", err)
			os.Exit(2)
		}
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "sipcurve" {
		if err := sipCurveMain(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "plot sipcurve:", err)
			os.Exit(2)
		}
		return
	}
	in := flag.String("in", "", "benchmark output directory (bench/http.sh or bench/sip.sh OUT, or run.sh's OUT)")
	out := flag.String("out", "", "directory for the PNGs (default: -in)")
	flag.Parse()
	if *in == "" || flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "usage: plot -in RUN_DIR [-out DIR]")
		os.Exit(2)
	}
	if *out == "" {
		*out = *in
	}
	paths, err := run(*in, *out)
	if err != nil {
		fmt.Fprintln(os.Stderr, "plot:", err)
		os.Exit(1)
	}
	for _, p := range paths {
		fmt.Println(p)
	}
}

// run loads the results below in and writes every chart they allow into
// out, returning the files written.
func run(in, out string) ([]string, error) {
	r, err := LoadRun(in)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return nil, fmt.Errorf("creating output directory: %w", err)
	}
	var paths []string
	for _, c := range Charts(r) {
		var buf bytes.Buffer
		if err := c.Render(&buf); err != nil {
			return paths, fmt.Errorf("drawing %s: %w", c.File, err)
		}
		p := filepath.Join(out, c.File)
		if err := os.WriteFile(p, buf.Bytes(), 0o644); err != nil {
			return paths, fmt.Errorf("writing chart: %w", err)
		}
		paths = append(paths, p)
	}
	return paths, nil
}
