package main

import (
	"bytes"
	"image/png"
	"strings"
	"testing"
)

const curvesInput = `goos: linux
pkg: github.com/sluicelb/sluice/lb
BenchmarkCurvePick/p2c/n=2-2         	 1000000	       300 ns/op	       150 cpu-ns/op	       0 B/op	       0 allocs/op
BenchmarkCurvePick/p2c/n=2-2         	 1000000	       100 ns/op	        90 cpu-ns/op	       0 B/op	       0 allocs/op
BenchmarkCurvePick/p2c/n=2-2         	 1000000	       200 ns/op	        95 cpu-ns/op	       8 B/op	       1 allocs/op
BenchmarkCurvePick/p2c/n=500-2       	 1000000	       210 ns/op	       0 B/op	       0 allocs/op
BenchmarkCurvePick/p2c/n=500-2       	 1000000	       190 ns/op	       0 B/op	       0 allocs/op
BenchmarkPick/p2c-2                  	 1000000	       50 ns/op	       0 B/op	       0 allocs/op
BenchmarkCurveDialog/lookup/n=0-2    	 1000000	       400 ns/op	       0 B/op	       0 allocs/op
BenchmarkCurveDialog/lookup/n=1000000-2	  100000	      1500 ns/op	  66.02 B/dialog	       0 B/op	       0 allocs/op
BenchmarkCurveRules/all-match/n=10   	  100000	      500.5 ns/op
PASS
`

// TestParseCurves: medians per point over the runs, the -GOMAXPROCS
// suffix dropped, extra metrics kept, other benchmarks skipped.
func TestParseCurves(t *testing.T) {
	pts, err := ParseCurves(strings.NewReader(curvesInput))
	if err != nil {
		t.Fatal(err)
	}
	var tsv bytes.Buffer
	if err := WriteCurvesTSV(&tsv, pts); err != nil {
		t.Fatal(err)
	}
	want := "family\tseries\tn\tcpu_ns_op\tns_op\tB_op\tallocs_op\truns\textra\n" +
		"Pick\tp2c\t2\t95\t200\t0\t0\t3\t\n" +
		"Pick\tp2c\t500\tn/a\t200\t0\t0\t2\t\n" +
		"Dialog\tlookup\t0\tn/a\t400\t0\t0\t1\t\n" +
		"Dialog\tlookup\t1000000\tn/a\t1500\t0\t0\t1\t66.02 B/dialog\n" +
		"Rules\tall-match\t10\tn/a\t500.5\tn/a\tn/a\t1\t\n"
	if tsv.String() != want {
		t.Errorf("TSV:\n%s\nwant:\n%s", tsv.String(), want)
	}
	var md bytes.Buffer
	if err := WriteCurvesMarkdown(&md, pts); err != nil {
		t.Fatal(err)
	}
	for _, row := range []string{
		"| Pick | p2c | 2: 95 (200) · 500: n/a (200) | 0, 0 |  |",
		"| Dialog | lookup | 0: n/a (400) · 1,000,000: n/a (1,500) | 0, 0 | 66.02 B/dialog |",
	} {
		if !strings.Contains(md.String(), row) {
			t.Errorf("Markdown lacks %q:\n%s", row, md.String())
		}
	}
}

// TestParseCurvesErrors: a malformed result line is an error naming it.
func TestParseCurvesErrors(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"BenchmarkCurvePick/p2c/n=x-2 10 5 ns/op\n", `"BenchmarkCurvePick/p2c/n=x-2": want a size n=N`},
		{"BenchmarkCurvePick/p2c/n=-3 10 5 ns/op\n", `want a size n=N`},
		{"BenchmarkCurvePick/p2c/n=2-2 10 five ns/op\n", `value "five" is not a number`},
		{"BenchmarkCurvePick/p2c/n=2-2 10 5 ns/op 3\n", "want value-unit pairs"},
		{"BenchmarkCurvePick/p2c/n=2-2 10 " + strings.Repeat("5", maxCurveLine) + " ns/op\n", "token too long"},
	} {
		_, err := ParseCurves(strings.NewReader(c.in))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%.60q: error %v, want one containing %q", c.in, err, c.want)
		}
	}
}

// TestCurveCharts: one PNG per family, named after it, the same bytes
// for the same input; a size of 0 is drawn on the log axis.
func TestCurveCharts(t *testing.T) {
	pts, err := ParseCurves(strings.NewReader(curvesInput))
	if err != nil {
		t.Fatal(err)
	}
	cs := CurveCharts(pts)
	var names []string
	for _, c := range cs {
		names = append(names, c.File)
		var a, b bytes.Buffer
		if err := c.Render(&a); err != nil {
			t.Fatalf("%s: %v", c.File, err)
		}
		if err := c.Render(&b); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(a.Bytes(), b.Bytes()) {
			t.Errorf("%s: two renderings differ", c.File)
		}
		img, err := png.Decode(&a)
		if err != nil {
			t.Fatalf("%s: %v", c.File, err)
		}
		if r := img.Bounds(); r.Dx() != 800 || r.Dy() != 450 {
			t.Errorf("%s: %v, want 800x450", c.File, r)
		}
	}
	if got, want := strings.Join(names, " "), "curves-pick.png curves-dialog.png curves-rules.png"; got != want {
		t.Errorf("charts %s, want %s", got, want)
	}
	var labels []string
	for _, tk := range (wholeTicks{}).Ticks(0, 8000) {
		if tk.Label != "" {
			labels = append(labels, tk.Label)
		}
	}
	if got, want := strings.Join(labels, " "), "0 4,000 8,000"; got != want {
		t.Errorf("tick labels %q, want %q", got, want)
	}
	if zeroAt(100000) != 10000 || zeroAt(1) != 0.1 {
		t.Errorf("zeroAt: %v %v", zeroAt(100000), zeroAt(1))
	}
}
