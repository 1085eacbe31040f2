package main

import (
	"fmt"
	"image/color"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/text"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// Chart geometry: PNGs of 800x450 (HTTP) and 1000x450 (SIP, two panels)
// pixels, small enough to commit and to read on a laptop screen.
const (
	dpi        = 100
	chartH     = 4.5 * vg.Inch
	httpChartW = 8 * vg.Inch
	sipChartW  = 10 * vg.Inch
)

// systemColors keeps each system's colour the same in every chart and run.
var systemColors = map[string]color.RGBA{
	"sluice":             {R: 0x1f, G: 0x5f, B: 0xa8, A: 0xff},
	"nginx":              {R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff},
	"HAProxy":            {R: 0xff, G: 0x7f, B: 0x0e, A: 0xff},
	"HAProxy (sticky)":   {R: 0xc8, G: 0x9a, B: 0x00, A: 0xff},
	"Kamailio (tm)":      {R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
	"Kamailio stateless": {R: 0x94, G: 0x67, B: 0xbd, A: 0xff},
	"direct (no LB)":     {R: 0x7f, G: 0x7f, B: 0x7f, A: 0xff},
}

// spareColors go, in order of appearance, to systems not listed above.
var spareColors = []color.RGBA{
	{R: 0x8c, G: 0x56, B: 0x4b, A: 0xff},
	{R: 0xe3, G: 0x77, B: 0xc2, A: 0xff},
	{R: 0x17, G: 0xbe, B: 0xcf, A: 0xff},
	{R: 0xbc, G: 0xbd, B: 0x22, A: 0xff},
}

// colorsFor maps display names to colours, deterministically.
func colorsFor(names []string) []color.RGBA {
	out := make([]color.RGBA, len(names))
	spare := 0
	for i, n := range names {
		if c, ok := systemColors[n]; ok {
			out[i] = c
			continue
		}
		out[i] = spareColors[spare%len(spareColors)]
		spare++
	}
	return out
}

// Chart is one picture to write: its file name and how to draw it.
type Chart struct {
	File string
	draw func(w io.Writer) error
}

// Render writes the chart as PNG.
func (c Chart) Render(w io.Writer) error { return c.draw(w) }

// Charts lists the pictures of a run: http.png (req/s), http-p99.png and
// http-cpu.png (balancer CPU per request) when it has HTTP points, sip.png
// (highest clean call rate and CPU per call) when it has a SIP sweep.
func Charts(run Run) []Chart {
	var cs []Chart
	if len(run.HTTP) > 0 {
		pts, env := run.HTTP, run.HTTPEnv
		load, cpuTitle := "HTTP", "balancer CPU per request (µs, lower is better)"
		if env.Load != "" {
			load, cpuTitle = env.Load, env.Load+": "+cpuTitle
		}
		cs = append(cs,
			Chart{"http.png", func(w io.Writer) error {
				return httpChart(w, pts, load+" throughput (req/s, higher is better)", env, "req/s",
					func(p HTTPPoint) float64 { return p.ReqPerSec }, fmtThousands)
			}},
			Chart{"http-p99.png", func(w io.Writer) error {
				return httpChart(w, pts, load+" p99 latency (ms, lower is better)", env, "p99 ms",
					func(p HTTPPoint) float64 { return p.P99 }, fmtFixed(2))
			}},
			Chart{"http-cpu.png", func(w io.Writer) error {
				return httpChart(w, pts, cpuTitle, env, "µs CPU / request",
					HTTPPoint.CPUPerReq, fmtFixed(1))
			}},
		)
	}
	if len(run.SIP) > 0 {
		res, env := run.SIP, run.SIPEnv
		cs = append(cs, Chart{"sip.png", func(w io.Writer) error { return sipChart(w, res, env) }})
	}
	return cs
}

// subtitle says which run a chart shows: its date, the time per point and
// the balancer CPU cap, if any.
func subtitle(env Env, secs string) string {
	var parts []string
	if env.Date != "" {
		parts = append(parts, "run of "+env.Date)
	}
	if secs != "" {
		parts = append(parts, secs+" s per point")
	}
	if env.Quota != "" {
		parts = append(parts, "every balancer capped at "+env.Quota+" % of one core")
	} else {
		parts = append(parts, "balancers pinned alone on one core")
	}
	return strings.Join(parts, ", ")
}

// series is one system's bars: one value per group, and the text above each.
type series struct {
	name   string
	values []float64 // NaN: no figure, drawn as an empty slot labelled "n/a"
}

// httpChart draws grouped bars: one group per connection count, one bar per
// system, sluice first.
func httpChart(w io.Writer, pts []HTTPPoint, title string, env Env, ylabel string,
	value func(HTTPPoint) float64, format func(float64) string) error {
	var conns []int
	var systems []string
	for _, p := range pts {
		if !slices.Contains(conns, p.Conns) {
			conns = append(conns, p.Conns)
		}
		if !slices.Contains(systems, p.System) {
			systems = append(systems, p.System)
		}
	}
	slices.Sort(conns)
	ss := make([]series, len(systems))
	for i, s := range systems {
		ss[i] = series{name: DisplayName(s), values: make([]float64, len(conns))}
		for j := range conns {
			ss[i].values[j] = math.NaN()
		}
	}
	for _, p := range pts {
		ss[slices.Index(systems, p.System)].values[slices.Index(conns, p.Conns)] = value(p)
	}
	groups := make([]string, len(conns))
	for i, c := range conns {
		groups[i] = strconv.Itoa(c) + " connections"
	}
	p, err := groupedBars(title+"\n"+subtitle(env, env.Duration), ylabel, groups, ss, format)
	if err != nil {
		return err
	}
	return writePNG(w, httpChartW, func(dc draw.Canvas) { p.Draw(dc) })
}

// groupedBars builds a bar plot with len(groups) groups of len(ss) bars and
// each bar's value written above it.
func groupedBars(title, ylabel string, groups []string, ss []series, format func(float64) string) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = title
	p.Title.TextStyle.Font.Size = vg.Points(12)
	p.Y.Label.Text = ylabel
	p.Y.Min = 0
	p.Y.Tick.Marker = thousandsTicks{}
	p.Legend.Top = true
	p.Legend.TextStyle.Font.Size = vg.Points(10)
	p.NominalX(groups...)
	p.X.Min, p.X.Max = -0.5, float64(len(groups))-0.5
	p.Add(hGrid()) // first, so the bars are drawn over it

	names := make([]string, len(ss))
	for i, s := range ss {
		names[i] = s.name
	}
	colors := colorsFor(names)
	n := len(ss)
	width := min(vg.Points(40), vg.Points(320)/vg.Length(max(1, n*len(groups))))
	maxV := 0.0
	for i, s := range ss {
		vals := make(plotter.Values, len(s.values))
		lab := plotter.XYLabels{XYs: make(plotter.XYs, len(s.values)), Labels: make([]string, len(s.values))}
		for j, v := range s.values {
			lab.XYs[j] = plotter.XY{X: float64(j)}
			if math.IsNaN(v) || math.IsInf(v, 0) {
				lab.Labels[j] = "n/a"
				continue
			}
			vals[j] = v
			lab.XYs[j].Y = v
			lab.Labels[j] = format(v)
			maxV = max(maxV, v)
		}
		bars, err := plotter.NewBarChart(vals, width)
		if err != nil {
			return nil, fmt.Errorf("bars of %s: %w", s.name, err)
		}
		bars.Color = colors[i]
		bars.LineStyle.Width = 0
		bars.Offset = vg.Length(float64(i)-float64(n-1)/2) * width
		p.Add(bars)
		p.Legend.Add(s.name, bars)

		labels, err := valueLabels(lab, bars.Offset)
		if err != nil {
			return nil, fmt.Errorf("labels of %s: %w", s.name, err)
		}
		p.Add(labels)
	}
	if maxV == 0 {
		maxV = 1
	}
	p.Y.Max = maxV * 1.35 // room for the labels and the legend above the bars
	return p, nil
}

// valueLabels writes each value centred above its bar.
func valueLabels(lab plotter.XYLabels, offset vg.Length) (*plotter.Labels, error) {
	l, err := plotter.NewLabels(lab)
	if err != nil {
		return nil, err
	}
	for i := range l.TextStyle {
		l.TextStyle[i].XAlign = text.XCenter
		l.TextStyle[i].Font = font.From(plotter.DefaultFont, vg.Points(8))
	}
	l.Offset = vg.Point{X: offset, Y: vg.Points(2)}
	return l, nil
}

// sipChart draws two panels side by side: each system's highest clean call
// rate, and the balancer's CPU per call at that rate.
func sipChart(w io.Writer, res []SIPResult, env Env) error {
	names := make([]string, len(res))
	rates := make([]float64, len(res))
	cpu := make([]float64, len(res))
	rateLabels := make([]string, len(res))
	for i, r := range res {
		names[i] = DisplayName(r.System)
		rates[i] = r.MaxCleanCPS
		rateLabels[i] = fmtThousands(r.MaxCleanCPS)
		if r.NoneClean != "" {
			rates[i] = math.NaN()
			rateLabels[i] = "none clean (" + r.NoneClean + ")"
		}
		cpu[i] = r.CPUPerCall()
	}
	left, err := systemBars("highest clean call rate (calls/s)\n"+subtitle(env, env.SIPSecs), "calls/s", names, rates, rateLabels)
	if err != nil {
		return err
	}
	cpuLabels := make([]string, len(res))
	for i, v := range cpu {
		switch {
		case res[i].NoneClean != "":
			cpuLabels[i] = "no clean rate"
		case math.IsNaN(res[i].LBCPU):
			cpuLabels[i] = "no balancer"
		default:
			cpuLabels[i] = fmtFixed(1)(v)
		}
	}
	right, err := systemBars("balancer CPU per call at that rate (µs)\nprocess CPU / clean calls per second, lower is better",
		"µs CPU / call", names, cpu, cpuLabels)
	if err != nil {
		return err
	}
	tiles := draw.Tiles{Rows: 1, Cols: 2, PadX: vg.Points(16), PadTop: vg.Points(4), PadBottom: vg.Points(4),
		PadLeft: vg.Points(4), PadRight: vg.Points(8)}
	return writePNG(w, sipChartW, func(dc draw.Canvas) {
		left.Draw(tiles.At(dc, 0, 0))
		right.Draw(tiles.At(dc, 1, 0))
	})
}

// systemBars is a bar per system, each in its system's colour, with the
// given text above it (NaN values draw no bar; their text says why).
func systemBars(title, ylabel string, names []string, values []float64, labels []string) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = title
	p.Title.TextStyle.Font.Size = vg.Points(11)
	p.Y.Label.Text = ylabel
	p.Y.Min = 0
	p.Y.Tick.Marker = thousandsTicks{}
	p.NominalX(names...)
	p.X.Min, p.X.Max = -0.5, float64(len(names))-0.5
	p.Add(hGrid())
	colors := colorsFor(names)
	maxV := 0.0
	for i, v := range values {
		lab := plotter.XYLabels{XYs: plotter.XYs{{X: float64(i)}}, Labels: []string{labels[i]}}
		if math.IsNaN(v) || math.IsInf(v, 0) {
			v = 0
		}
		lab.XYs[0].Y = v
		maxV = max(maxV, v)
		bars, err := plotter.NewBarChart(plotter.Values{v}, vg.Points(48))
		if err != nil {
			return nil, fmt.Errorf("bar of %s: %w", names[i], err)
		}
		bars.XMin = float64(i)
		bars.Color = colors[i]
		bars.LineStyle.Width = 0
		p.Add(bars)
		l, err := valueLabels(lab, 0)
		if err != nil {
			return nil, fmt.Errorf("label of %s: %w", names[i], err)
		}
		p.Add(l)
	}
	if maxV == 0 {
		maxV = 1
	}
	p.Y.Max = maxV * 1.2
	return p, nil
}

// writePNG renders onto a white canvas of width x chartH and encodes it.
func writePNG(w io.Writer, width vg.Length, paint func(draw.Canvas)) error {
	c := vgimg.NewWith(vgimg.UseWH(width, chartH), vgimg.UseDPI(dpi), vgimg.UseBackgroundColor(color.White))
	paint(draw.New(c))
	_, err := vgimg.PngCanvas{Canvas: c}.WriteTo(w)
	return err
}

// hGrid is horizontal grid lines only: vertical ones would cut the groups.
func hGrid() *plotter.Grid {
	g := plotter.NewGrid()
	g.Vertical.Color = nil
	return g
}

// thousandsTicks are gonum's default ticks with 80000 written 80,000.
type thousandsTicks struct{}

func (thousandsTicks) Ticks(lo, hi float64) []plot.Tick {
	ts := plot.DefaultTicks{}.Ticks(lo, hi)
	for i, t := range ts {
		if t.Label != "" && t.Value >= 10000 && t.Value == math.Trunc(t.Value) {
			ts[i].Label = fmtThousands(t.Value)
		}
	}
	return ts
}

// fmtThousands prints 91665.4 as "91,665".
func fmtThousands(v float64) string {
	if math.IsNaN(v) {
		return "n/a"
	}
	s := strconv.FormatInt(int64(math.Round(v)), 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, r := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(r)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// fmtFixed prints with the given number of decimals, "n/a" for NaN.
func fmtFixed(decimals int) func(float64) string {
	return func(v float64) string {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return "n/a"
		}
		return strconv.FormatFloat(v, 'f', decimals, 64)
	}
}
