package main

import (
	"bytes"
	"image"
	"image/color"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// render draws a chart and decodes the PNG it wrote.
func render(t *testing.T, c Chart) ([]byte, image.Image) {
	t.Helper()
	var buf bytes.Buffer
	if err := c.Render(&buf); err != nil {
		t.Fatalf("%s: %v", c.File, err)
	}
	img, err := png.Decode(bytes.NewReader(buf.Bytes()))
	if err != nil {
		t.Fatalf("%s: not a PNG: %v", c.File, err)
	}
	return buf.Bytes(), img
}

// histogram counts the pixels of each colour. A bar's fill shows as its
// exact colour (the edges are anti-aliased into other shades, the inside
// is not).
func histogram(img image.Image) map[color.RGBA]int {
	h := map[color.RGBA]int{}
	b := img.Bounds()
	if m, ok := img.(*image.RGBA); ok && m.Stride == 4*b.Dx() { // what png.Decode returns for opaque RGB
		for i := 0; i+3 < len(m.Pix); i += 4 {
			h[color.RGBA{m.Pix[i], m.Pix[i+1], m.Pix[i+2], m.Pix[i+3]}]++
		}
		return h
	}
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			h[color.RGBAModel.Convert(img.At(x, y)).(color.RGBA)]++
		}
	}
	return h
}

// nonWhite is the share of pixels that are not the white background.
func nonWhite(img image.Image, h map[color.RGBA]int) float64 {
	b := img.Bounds()
	return 1 - float64(h[color.RGBA{0xff, 0xff, 0xff, 0xff}])/float64(b.Dx()*b.Dy())
}

func loadTestdata(t *testing.T, dir string) Run {
	t.Helper()
	r, err := LoadRun(dir)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func chartFiles(cs []Chart) []string {
	var fs []string
	for _, c := range cs {
		fs = append(fs, c.File)
	}
	return fs
}

// TestChartsOfRealRuns draws every chart of the testdata runs: each is a
// PNG of the fixed size, not blank, with a bar in the colour of every
// system that has a figure.
func TestChartsOfRealRuns(t *testing.T) {
	tests := []struct {
		dir       string
		files     []string
		w, h      int
		systems   []string // display names whose bars must show
		minCharts int
	}{
		{dir: "testdata/http", files: []string{"http.png", "http-p99.png", "http-cpu.png"}, w: 800, h: 450,
			systems: []string{"sluice", "HAProxy", "nginx"}},
		{dir: "testdata/http-quota", files: []string{"http.png", "http-p99.png", "http-cpu.png"}, w: 800, h: 450,
			systems: []string{"sluice", "HAProxy", "nginx"}},
		{dir: "testdata/sip", files: []string{"sip.png"}, w: 1000, h: 450,
			systems: []string{"sluice"}},
		{dir: "testdata/sip-quota", files: []string{"sip.png"}, w: 1000, h: 450,
			systems: []string{"Kamailio stateless"}}, // sluice had no clean rate in it
	}
	for _, tc := range tests {
		t.Run(tc.dir, func(t *testing.T) {
			cs := Charts(loadTestdata(t, tc.dir))
			if got := chartFiles(cs); !slices.Equal(got, tc.files) {
				t.Fatalf("charts %v, want %v", got, tc.files)
			}
			for _, c := range cs {
				_, img := render(t, c)
				if b := img.Bounds(); b.Dx() != tc.w || b.Dy() != tc.h {
					t.Errorf("%s: %dx%d, want %dx%d", c.File, b.Dx(), b.Dy(), tc.w, tc.h)
				}
				h := histogram(img)
				if nw := nonWhite(img, h); nw < 0.02 {
					t.Errorf("%s: only %.1f%% of pixels drawn", c.File, 100*nw)
				}
				for _, s := range tc.systems {
					if n := h[systemColors[s]]; n < 500 {
						t.Errorf("%s: %d pixels of %s's colour, want its bars", c.File, n, s)
					}
				}
			}
		})
	}
}

// TestChartsDeterministic: the same input gives byte-identical PNGs, so a
// chart committed from a run changes only when the run does.
func TestChartsDeterministic(t *testing.T) {
	for _, dir := range []string{"testdata/http", "testdata/sip"} {
		a, b := Charts(loadTestdata(t, dir)), Charts(loadTestdata(t, dir))
		for i := range a {
			pa, _ := render(t, a[i])
			pb, _ := render(t, b[i])
			if !bytes.Equal(pa, pb) {
				t.Errorf("%s/%s: two renderings differ", dir, a[i].File)
			}
		}
	}
}

// TestBarHeightsFollowValues: with sluice at twice nginx's req/s and equal
// bar widths, sluice's bars cover twice the pixels; with the figures
// swapped, half. A chart that mixed up systems or values would fail.
func TestBarHeightsFollowValues(t *testing.T) {
	nan := math.NaN()
	for _, tc := range []struct {
		sluice, nginx float64
	}{{60000, 30000}, {30000, 60000}} {
		run := Run{HTTP: []HTTPPoint{
			{System: "http-target", Conns: 50, ReqPerSec: tc.sluice, P50: nan, P99: 1, LBCPU: 90},
			{System: "http-nginx", Conns: 50, ReqPerSec: tc.nginx, P50: nan, P99: 1, LBCPU: 90},
		}}
		_, img := render(t, Charts(run)[0])
		h := histogram(img)
		s, n := h[systemColors["sluice"]], h[systemColors["nginx"]]
		want := tc.sluice / tc.nginx
		if got := float64(s) / float64(n); math.Abs(got-want) > 0.05*want {
			t.Errorf("sluice %v req/s, nginx %v: pixel ratio %.3f (%d/%d), want %.2f", tc.sluice, tc.nginx, got, s, n, want)
		}
	}
}

// TestSIPChartWithoutCleanRate: a system with no clean rate and one with no
// balancer CPU (sip-direct) still chart; they get no bar of their own.
func TestSIPChartWithoutCleanRate(t *testing.T) {
	nan := math.NaN()
	run := Run{SIP: []SIPResult{
		{System: "sip-target", MaxCleanCPS: 8000, LBCPU: 54, P99: 16},
		{System: "sip-kamailio", NoneClean: "<2000", LBCPU: nan, P99: nan},
	}}
	_, img := render(t, Charts(run)[0])
	h := histogram(img)
	if n := h[systemColors["sluice"]]; n < 500 {
		t.Errorf("sluice bars: %d pixels", n)
	}
	if n := h[systemColors["Kamailio (tm)"]]; n != 0 {
		t.Errorf("Kamailio without a clean rate: %d pixels of bar, want none", n)
	}
}

func TestRunWritesFiles(t *testing.T) {
	out := t.TempDir()
	paths, err := run("testdata/sip", out)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{filepath.Join(out, "sip.png")}; !slices.Equal(paths, want) {
		t.Fatalf("wrote %v, want %v", paths, want)
	}
	f, err := os.Open(paths[0])
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := png.Decode(f); err != nil {
		t.Errorf("%s: %v", paths[0], err)
	}
	if _, err := run(t.TempDir(), out); err == nil {
		t.Error("a directory without results: no error")
	}
}
