package main

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"image/color"
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

// CurvePoint is the median of the runs of one sub-benchmark of a
// BenchmarkCurve<Family> function, named SERIES/n=N.
type CurvePoint struct {
	Family, Series string
	N              int
	NsOp           float64 // median ns per operation (wall clock)
	CPUNsOp        float64 // median process CPU ns per operation (cpu-ns/op); NaN when not reported
	BytesOp        float64 // median B/op
	AllocsOp       float64 // median allocs/op
	Extra          string  // other metrics as "median unit", comma-separated ("" when none)
	Runs           int     // runs the medians are over
}

// maxCurveLine bounds a line of go test output: a longer one is an error,
// not a reason to buffer without limit.
const maxCurveLine = 64 << 10

// ParseCurves reads `go test -bench BenchmarkCurve -benchmem` output (any
// -count, several packages) and returns one point per family, series and
// size with the medians of its runs, in the order first seen. Lines that
// are not results of a BenchmarkCurve sub-benchmark named SERIES/n=N are
// skipped.
func ParseCurves(r io.Reader) ([]CurvePoint, error) {
	type acc struct {
		p      CurvePoint
		ns     []float64
		cpu    []float64
		bytes  []float64
		allocs []float64
		extra  map[string][]float64
		units  []string
	}
	var order []string
	accs := map[string]*acc{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 4096), maxCurveLine)
	for line := 1; sc.Scan(); line++ {
		f := strings.Fields(sc.Text())
		if len(f) < 4 || !strings.HasPrefix(f[0], "BenchmarkCurve") {
			continue
		}
		name := f[0]
		if i := strings.LastIndexByte(name, '-'); i > 0 && !strings.Contains(name[i:], "/") {
			if _, err := strconv.Atoi(name[i+1:]); err == nil {
				name = name[:i] // the -GOMAXPROCS suffix
			}
		}
		parts := strings.Split(name, "/")
		if len(parts) != 3 || !strings.HasPrefix(parts[2], "n=") {
			continue
		}
		n, err := strconv.Atoi(strings.TrimPrefix(parts[2], "n="))
		if err != nil || n < 0 {
			return nil, fmt.Errorf("line %d: %q: want a size n=N with N a whole number >= 0", line, f[0])
		}
		key := parts[0] + "/" + parts[1] + "/" + strconv.Itoa(n)
		a := accs[key]
		if a == nil {
			a = &acc{p: CurvePoint{Family: strings.TrimPrefix(parts[0], "BenchmarkCurve"), Series: parts[1], N: n}, extra: map[string][]float64{}}
			accs[key] = a
			order = append(order, key)
		}
		// f[1] is b.N; then value unit pairs.
		if (len(f)-2)%2 != 0 {
			return nil, fmt.Errorf("line %d: %q: want value-unit pairs after the iteration count", line, sc.Text())
		}
		for i := 2; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				return nil, fmt.Errorf("line %d: %q: value %q is not a number", line, f[0], f[i])
			}
			switch u := f[i+1]; u {
			case "ns/op":
				a.ns = append(a.ns, v)
			case "cpu-ns/op":
				a.cpu = append(a.cpu, v)
			case "B/op":
				a.bytes = append(a.bytes, v)
			case "allocs/op":
				a.allocs = append(a.allocs, v)
			default:
				if _, ok := a.extra[u]; !ok {
					a.units = append(a.units, u)
				}
				a.extra[u] = append(a.extra[u], v)
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading benchmark output: %w", err)
	}
	out := make([]CurvePoint, 0, len(order))
	for _, k := range order {
		a := accs[k]
		if len(a.ns) == 0 {
			continue
		}
		p := a.p
		p.Runs = len(a.ns)
		p.NsOp, p.CPUNsOp, p.BytesOp, p.AllocsOp = median(a.ns), median(a.cpu), median(a.bytes), median(a.allocs)
		var ex []string
		for _, u := range a.units {
			ex = append(ex, strconv.FormatFloat(median(a.extra[u]), 'f', -1, 64)+" "+u)
		}
		p.Extra = strings.Join(ex, ", ")
		out = append(out, p)
	}
	return out, nil
}

// median of vs, NaN when empty.
func median(vs []float64) float64 {
	if len(vs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(vs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// WriteCurvesTSV writes the points with a header line.
func WriteCurvesTSV(w io.Writer, pts []CurvePoint) error {
	var b bytes.Buffer
	b.WriteString("family\tseries\tn\tcpu_ns_op\tns_op\tB_op\tallocs_op\truns\textra\n")
	for _, p := range pts {
		fmt.Fprintf(&b, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%d\t%s\n", p.Family, p.Series, p.N,
			fmtNum(p.CPUNsOp), fmtNum(p.NsOp), fmtNum(p.BytesOp), fmtNum(p.AllocsOp), p.Runs, p.Extra)
	}
	_, err := w.Write(b.Bytes())
	return err
}

// fmtNum prints v with at most one decimal, "n/a" for NaN.
func fmtNum(v float64) string {
	if math.IsNaN(v) {
		return "n/a"
	}
	return strconv.FormatFloat(math.Round(v*10)/10, 'f', -1, 64)
}

// WriteCurvesMarkdown writes one table row per family and series: the
// median CPU ns/op at each size (wall-clock ns/op in brackets), and the
// allocations at the largest.
func WriteCurvesMarkdown(w io.Writer, pts []CurvePoint) error {
	var b bytes.Buffer
	b.WriteString("| curve | series | size: CPU ns/op (wall ns/op) | B/op, allocs/op (largest) | other |\n|---|---|---|---|---|\n")
	for _, fam := range curveFamilies(pts) {
		for _, s := range curveSeries(pts, fam) {
			var cells []string
			var last CurvePoint
			for _, p := range pts {
				if p.Family == fam && p.Series == s {
					cells = append(cells, fmt.Sprintf("%s: %s (%s)", fmtThousands(float64(p.N)), fmtThousands(p.CPUNsOp), fmtThousands(p.NsOp)))
					if p.N >= last.N {
						last = p
					}
				}
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s, %s | %s |\n", fam, s, strings.Join(cells, " · "),
				fmtNum(last.BytesOp), fmtNum(last.AllocsOp), last.Extra)
		}
	}
	_, err := w.Write(b.Bytes())
	return err
}

func curveFamilies(pts []CurvePoint) []string {
	var fs []string
	for _, p := range pts {
		if !slices.Contains(fs, p.Family) {
			fs = append(fs, p.Family)
		}
	}
	return fs
}

func curveSeries(pts []CurvePoint, fam string) []string {
	var ss []string
	for _, p := range pts {
		if p.Family == fam && !slices.Contains(ss, p.Series) {
			ss = append(ss, p.Series)
		}
	}
	return ss
}

// curveTitles are the charts' titles by family; an unknown family is
// titled by its name.
var curveTitles = map[string]string{
	"Pick":      "lb: one pick per policy as the pool grows (backends)",
	"Route":     "lb: route choice as the table grows (routes; the last one matches)",
	"Rules":     "admission: Controller.Decide as ARM rules grow (rules)",
	"Dialog":    "sip: dialog table as it grows (live dialogs)",
	"AdmitPick": "http: admit + pick, no I/O (routes; ARM rules)",
	"RoundTrip": "http: keep-alive round trip, loop engine (routes; ARM rules)",
}

// CurveCharts is one chart per family, curves-<family>.png: CPU ns per
// operation (wall-clock ns where no CPU time was reported) against size, one line per series, log x (a size of 0 is
// drawn a tenth of the way below the smallest other one and labelled 0),
// log y when the values span more than a factor of 20.
func CurveCharts(pts []CurvePoint) []Chart {
	var cs []Chart
	for _, fam := range curveFamilies(pts) {
		var fp []CurvePoint
		for _, p := range pts {
			if p.Family == fam {
				fp = append(fp, p)
			}
		}
		cs = append(cs, Chart{"curves-" + strings.ToLower(fam) + ".png", func(w io.Writer) error { return curveChart(w, fam, fp) }})
	}
	return cs
}

// curvePalette colours a chart's series in order: six that stay apart
// (a family has at most five series).
var curvePalette = []color.RGBA{
	{R: 0x1f, G: 0x5f, B: 0xa8, A: 0xff},
	{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff},
	{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff},
	{R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
	{R: 0x94, G: 0x67, B: 0xbd, A: 0xff},
	{R: 0x8c, G: 0x56, B: 0x4b, A: 0xff},
}

// wholeTicks are gonum's default ticks labelled as whole numbers with
// thousands separators (750, 1,500), as ns per operation reads.
type wholeTicks struct{}

func (wholeTicks) Ticks(lo, hi float64) []plot.Tick {
	ts := plot.DefaultTicks{}.Ticks(lo, hi)
	for i, t := range ts {
		if t.Label != "" {
			ts[i].Label = fmtThousands(t.Value)
		}
	}
	return ts
}

// zeroAt is where a size of 0 goes on a log axis whose smallest other
// size is lo.
func zeroAt(lo int) float64 { return float64(max(lo, 1)) / 10 }

// y is what a chart draws of a point: its CPU time per operation, else
// its wall-clock time.
func (p CurvePoint) y() float64 {
	if p.CPUNsOp > 0 {
		return p.CPUNsOp
	}
	return p.NsOp
}

func curveChart(w io.Writer, fam string, pts []CurvePoint) error {
	title := curveTitles[fam]
	if title == "" {
		title = fam
	}
	lo := math.MaxInt
	var sizes []int
	ymin, ymax := math.Inf(1), math.Inf(-1)
	for _, p := range pts {
		if p.N > 0 {
			lo = min(lo, p.N)
		}
		if !slices.Contains(sizes, p.N) {
			sizes = append(sizes, p.N)
		}
		if y := p.y(); y > 0 {
			ymin, ymax = min(ymin, y), max(ymax, y)
		}
	}
	if math.IsInf(ymin, 1) {
		return fmt.Errorf("family %s: no positive ns/op to draw", fam)
	}
	slices.Sort(sizes)
	xAt := func(n int) float64 {
		if n == 0 {
			return zeroAt(lo)
		}
		return float64(n)
	}
	p := plot.New()
	p.Title.Text = title + "\nmedian of the runs per point: process CPU time per operation"
	p.Title.TextStyle.Font.Size = vg.Points(12)
	p.X.Label.Text = "size (log scale)"
	p.X.Scale = plot.LogScale{}
	var ticks []plot.Tick
	for _, n := range sizes {
		ticks = append(ticks, plot.Tick{Value: xAt(n), Label: fmtThousands(float64(n))})
	}
	p.X.Tick.Marker = plot.ConstantTicks(ticks)
	p.X.Min, p.X.Max = xAt(sizes[0])/1.5, xAt(sizes[len(sizes)-1])*1.5
	p.Y.Label.Text = "CPU ns per operation"
	if ymax/ymin > 20 {
		p.Y.Label.Text += " (log scale)"
		p.Y.Scale = plot.LogScale{}
		p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
		p.Y.Min, p.Y.Max = ymin/1.5, ymax*1.5
	} else {
		p.Y.Min, p.Y.Max = 0, ymax*1.15
		p.Y.Tick.Marker = wholeTicks{}
	}
	p.Legend.Top = true
	p.Legend.Left = true
	p.Legend.TextStyle.Font.Size = vg.Points(10)
	p.Add(plotter.NewGrid())
	series := curveSeries(pts, fam)
	for i, s := range series {
		var xys plotter.XYs
		for _, q := range pts {
			if q.Series == s && q.y() > 0 {
				xys = append(xys, plotter.XY{X: xAt(q.N), Y: q.y()})
			}
		}
		if err := addCurve(p, i, s, xys, false); err != nil {
			return fmt.Errorf("family %s series %s: %w", fam, s, err)
		}
	}
	return writePNG(w, httpChartW, func(dc draw.Canvas) { p.Draw(dc) })
}

// addCurve adds series i, named name, to p and its legend: a line with a
// circle at each point of xys (sorted by x here) in the i-th colour of
// curvePalette; with dashRepeat, series past the palette's length take
// its colours again dashed, so that no two lines look the same.
func addCurve(p *plot.Plot, i int, name string, xys plotter.XYs, dashRepeat bool) error {
	slices.SortFunc(xys, func(a, b plotter.XY) int { return int(math.Copysign(1, a.X-b.X)) })
	l, sc, err := plotter.NewLinePoints(xys)
	if err != nil {
		return err
	}
	c := curvePalette[i%len(curvePalette)]
	l.Color, sc.Color = c, c
	l.Width = vg.Points(1.5)
	if dashRepeat && i >= len(curvePalette) {
		l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
	}
	sc.Shape = draw.CircleGlyph{}
	sc.Radius = vg.Points(3)
	p.Add(l, sc)
	p.Legend.Add(name, l, sc)
	return nil
}

// curvesMain is `plot curves`: go test output in, TSV, Markdown table and
// one PNG per family out.
func curvesMain(args []string) error {
	fs := flag.NewFlagSet("curves", flag.ContinueOnError)
	in := fs.String("in", "", "go test -bench BenchmarkCurve -benchmem output (several -count runs)")
	out := fs.String("out", "", "directory for the PNGs (curves-<family>.png)")
	tsv := fs.String("tsv", "", "file for the medians as TSV (optional)")
	md := fs.String("md", "", "file for the Markdown table (optional)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *in == "" || *out == "" || fs.NArg() > 0 {
		return fmt.Errorf("usage: plot curves -in BENCH_OUTPUT -out DIR [-tsv FILE] [-md FILE]")
	}
	f, err := os.Open(*in)
	if err != nil {
		return err
	}
	defer f.Close()
	pts, err := ParseCurves(f)
	if err != nil {
		return fmt.Errorf("%s: %w", *in, err)
	}
	if len(pts) == 0 {
		return fmt.Errorf("-in %s: no BenchmarkCurve results (want lines such as BenchmarkCurvePick/p2c/n=50-2 ... ns/op)", *in)
	}
	for _, o := range []struct {
		path  string
		write func(io.Writer, []CurvePoint) error
	}{{*tsv, WriteCurvesTSV}, {*md, WriteCurvesMarkdown}} {
		if o.path == "" {
			continue
		}
		var b bytes.Buffer
		if err := o.write(&b, pts); err != nil {
			return err
		}
		if err := os.WriteFile(o.path, b.Bytes(), 0o644); err != nil {
			return err
		}
		fmt.Println(o.path)
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return fmt.Errorf("creating output directory: %w", err)
	}
	for _, c := range CurveCharts(pts) {
		var buf bytes.Buffer
		if err := c.Render(&buf); err != nil {
			return fmt.Errorf("drawing %s: %w", c.File, err)
		}
		p := filepath.Join(*out, c.File)
		if err := os.WriteFile(p, buf.Bytes(), 0o644); err != nil {
			return fmt.Errorf("writing chart: %w", err)
		}
		fmt.Println(p)
	}
	return nil
}
