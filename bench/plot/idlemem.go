package main

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// IdlePoint is one point of bench/idle-mem.sh: a system's bytes per idle
// connection with N connections open.
type IdlePoint struct {
	Series string // LEG/SYSTEM, such as http/nginx
	N      int
	Bytes  float64
}

// maxIdleLines bounds the points read: the file is a few dozen lines.
const maxIdleLines = 10000

// ParseIdle reads bench/idle-mem.sh's idle-mem.tsv: SERIES, N and bytes per
// idle connection, tab-separated, one point a line.
func ParseIdle(r io.Reader) ([]IdlePoint, error) {
	var pts []IdlePoint
	sc := bufio.NewScanner(r)
	for line := 1; sc.Scan(); line++ {
		if line > maxIdleLines {
			return nil, fmt.Errorf("over %d lines", maxIdleLines)
		}
		if strings.TrimSpace(sc.Text()) == "" {
			continue
		}
		f := strings.Split(sc.Text(), "\t")
		if len(f) != 3 {
			return nil, fmt.Errorf("line %d: %d fields, want 3 (series, N, bytes)", line, len(f))
		}
		n, err := strconv.Atoi(f[1])
		if err != nil || n < 1 {
			return nil, fmt.Errorf("line %d: N %q: want a positive integer", line, f[1])
		}
		b, err := strconv.ParseFloat(f[2], 64)
		if err != nil || math.IsNaN(b) || math.IsInf(b, 0) {
			return nil, fmt.Errorf("line %d: bytes %q: want a number", line, f[2])
		}
		pts = append(pts, IdlePoint{f[0], n, b})
	}
	return pts, sc.Err()
}

// idleChart draws bytes per idle connection against N (log x), one line
// per series in the order first seen.
func idleChart(w io.Writer, pts []IdlePoint) error {
	if len(pts) == 0 {
		return fmt.Errorf("no points to draw")
	}
	var series []string
	var sizes []int
	ymin, ymax := math.Inf(1), 0.0
	for _, p := range pts {
		if !slices.Contains(series, p.Series) {
			series = append(series, p.Series)
		}
		if !slices.Contains(sizes, p.N) {
			sizes = append(sizes, p.N)
		}
		ymax = max(ymax, p.Bytes)
		if p.Bytes > 0 {
			ymin = min(ymin, p.Bytes)
		}
	}
	slices.Sort(sizes)
	p := plot.New()
	p.Title.Text = "Memory per idle keep-alive connection (PSS summed over the system's processes)\n(after - before) / N, bench/idle-mem.sh"
	p.Title.TextStyle.Font.Size = vg.Points(12)
	p.X.Label.Text = "idle connections N (log scale)"
	p.X.Scale = plot.LogScale{}
	var ticks []plot.Tick
	for i, n := range sizes {
		t := plot.Tick{Value: float64(n), Label: fmtThousands(float64(n))}
		if i+1 < len(sizes) && float64(sizes[i+1]) < 1.25*float64(n) {
			t.Label = "" // 9,500 beside 10,000: one label
		}
		ticks = append(ticks, t)
	}
	p.X.Tick.Marker = plot.ConstantTicks(ticks)
	p.X.Min, p.X.Max = float64(sizes[0])/1.5, float64(sizes[len(sizes)-1])*1.5
	p.Y.Label.Text = "bytes per idle connection"
	logY := ymax/ymin > 20 // systems 50x apart: a linear axis flattens the small ones
	if logY {
		p.Y.Label.Text += " (log scale)"
		p.Y.Scale = plot.LogScale{}
		p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
		p.Y.Min, p.Y.Max = ymin/1.5, ymax*8 // room for the legend above the lines
	} else {
		p.Y.Min, p.Y.Max = min(0, ymax), max(ymax*1.6, 1)
		p.Y.Tick.Marker = wholeTicks{}
	}
	p.Legend.Top = true
	p.Legend.Left = true
	p.Legend.TextStyle.Font.Size = vg.Points(10)
	p.Add(plotter.NewGrid())
	for i, s := range series {
		var xys plotter.XYs
		for _, q := range pts {
			if q.Series == s && (q.Bytes > 0 || !logY) {
				xys = append(xys, plotter.XY{X: float64(q.N), Y: q.Bytes})
			}
		}
		if len(xys) == 0 {
			continue
		}
		if err := addCurve(p, i, s, xys, true); err != nil {
			return fmt.Errorf("series %s: %w", s, err)
		}
	}
	return writePNG(w, httpChartW, func(dc draw.Canvas) { p.Draw(dc) })
}

// idleMain is `plot idlemem`: idle-mem.tsv in, idle-mem.png out.
func idleMain(args []string) error {
	fs := flag.NewFlagSet("idlemem", flag.ContinueOnError)
	in := fs.String("in", "", "bench/idle-mem.sh's OUT/idle-mem.tsv")
	out := fs.String("out", "", "directory for idle-mem.png")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *in == "" || *out == "" || fs.NArg() > 0 {
		return fmt.Errorf("usage: plot idlemem -in IDLE_MEM_TSV -out DIR")
	}
	f, err := os.Open(*in)
	if err != nil {
		return err
	}
	defer f.Close()
	pts, err := ParseIdle(f)
	if err != nil {
		return fmt.Errorf("%s: %w", *in, err)
	}
	var buf bytes.Buffer
	if err := idleChart(&buf, pts); err != nil {
		return fmt.Errorf("%s: %w", *in, err)
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return fmt.Errorf("creating output directory: %w", err)
	}
	p := filepath.Join(*out, "idle-mem.png")
	if err := os.WriteFile(p, buf.Bytes(), 0o644); err != nil {
		return fmt.Errorf("writing chart: %w", err)
	}
	fmt.Println(p)
	return nil
}
