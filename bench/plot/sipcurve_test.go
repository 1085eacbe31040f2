package main

import (
	"bytes"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const sipCurveTSV = "system\taxis\tsize\tus_per_call\trss_kb\tfailed\truns\n" +
	"kamailio\ttransport\t0\t339.1\t24044\t0\t3\n" +
	"kamailio\ttransport\t10\t332.9\t33248\t0\t3\n" +
	"kamailio\ttransport\t10000\t349.6\t33940\t2\t3\n" +
	"sluice\tdialogs\t0\t224.1\t49692\t0\t3\n" +
	"sluice\tdialogs\t100000\t239.3\t101708\t0\t3\n" +
	"sluice\tdialogs\t1000000\t251.0\t401708\t0\t3\n" +
	"sluice\ttransport\t0\t224.1\t49692\t0\t3\n" +
	"sluice\ttransport\t10\t375.8\t49492\t0\t3\n" +
	"sluice\ttransport\t10000\t306.1\t49820\t0\t3\n"

func TestParseSIPCurve(t *testing.T) {
	pts, err := ParseSIPCurve(strings.NewReader(sipCurveTSV))
	if err != nil {
		t.Fatal(err)
	}
	if len(pts) != 9 {
		t.Fatalf("%d points, want 9", len(pts))
	}
	if want := (SIPCurvePoint{"kamailio", "transport", 10000, 349.6, 33940, 2, 3}); pts[2] != want {
		t.Errorf("point 3: %+v, want %+v", pts[2], want)
	}
	for _, bad := range []struct{ in, err string }{
		{"sluice\tdialogs\t0\t1\t2\t0\n", "6 fields"},
		{"sluice\tdialog\t0\t1\t2\t0\t1\n", "axis \"dialog\""},
		{"sluice\tdialogs\t-1\t1\t2\t0\t1\n", "field 3 \"-1\""},
		{"sluice\tdialogs\t0\tNaN\t2\t0\t1\n", "us_per_call \"NaN\""},
		{"sluice\tdialogs\t0\t1\t2x\t0\t1\n", "field 5 \"2x\""},
	} {
		if _, err := ParseSIPCurve(strings.NewReader(bad.in)); err == nil || !strings.Contains(err.Error(), bad.err) {
			t.Errorf("%q: error %v, want one saying %s", bad.in, err, bad.err)
		}
	}
}

func TestSIPCurveCharts(t *testing.T) {
	pts, err := ParseSIPCurve(strings.NewReader(sipCurveTSV))
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range sipCurveCharts {
		var a, b bytes.Buffer
		if err := sipCurveChart(&a, i, pts); err != nil {
			t.Fatalf("%s: %v", c.file, err)
		}
		if err := sipCurveChart(&b, i, pts); err != nil || !bytes.Equal(a.Bytes(), b.Bytes()) {
			t.Errorf("%s: the same points drew two different files (%v)", c.file, err)
		}
		img, err := png.Decode(bytes.NewReader(a.Bytes()))
		if err != nil {
			t.Fatal(err)
		}
		h := histogram(img)
		systems := 1
		if c.axis == "transport" {
			systems = 2
		}
		for s := range systems {
			if h[curvePalette[s]] == 0 {
				t.Errorf("%s: series %d has no pixel of its colour", c.file, s)
			}
		}
	}
	if err := sipCurveChart(new(bytes.Buffer), 0, pts[:3]); err == nil {
		t.Error("a chart of the dialogs axis drew with no dialogs points")
	}
}

func TestSIPCurveMainWritesAxesWithPoints(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "s.tsv")
	// Only the transport axis: the two dialogs charts are not written.
	var only strings.Builder
	for l := range strings.SplitSeq(sipCurveTSV, "\n") {
		if !strings.Contains(l, "\tdialogs\t") {
			only.WriteString(l + "\n")
		}
	}
	if err := os.WriteFile(in, []byte(only.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := sipCurveMain([]string{"-in", in, "-out", dir}); err != nil {
		t.Fatal(err)
	}
	for _, c := range sipCurveCharts {
		_, err := os.Stat(filepath.Join(dir, c.file))
		if (c.axis == "transport") != (err == nil) {
			t.Errorf("%s: written %v, want it written only for the transport axis", c.file, err == nil)
		}
	}
}
