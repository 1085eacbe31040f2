package main

import (
	"bytes"
	"image/png"
	"strings"
	"testing"
)

func TestParseIdle(t *testing.T) {
	pts, err := ParseIdle(strings.NewReader("http/sluice\t1000\t9820\nhttp/nginx\t1000\t1485.5\n\nhttp/sluice\t10000\t8000\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := []IdlePoint{{"http/sluice", 1000, 9820}, {"http/nginx", 1000, 1485.5}, {"http/sluice", 10000, 8000}}
	if len(pts) != len(want) {
		t.Fatalf("got %v, want %v", pts, want)
	}
	for i := range want {
		if pts[i] != want[i] {
			t.Errorf("point %d: %v, want %v", i, pts[i], want[i])
		}
	}
	for _, bad := range []struct{ in, err string }{
		{"http/sluice\t1000\n", "2 fields"},
		{"http/sluice\t0\t5\n", "N \"0\""},
		{"http/sluice\tx\t5\n", "N \"x\""},
		{"http/sluice\t10\tn/a\n", "bytes \"n/a\""},
		{"http/sluice\t10\tNaN\n", "bytes \"NaN\""},
	} {
		if _, err := ParseIdle(strings.NewReader(bad.in)); err == nil || !strings.Contains(err.Error(), bad.err) {
			t.Errorf("%q: error %v, want one saying %s", bad.in, err, bad.err)
		}
	}
}

func TestIdleChart(t *testing.T) {
	pts := []IdlePoint{{"http/sluice", 1000, 9820}, {"http/nginx", 1000, 1485}, {"http/sluice", 10000, 8000}, {"http/nginx", 10000, 1300}}
	var a, b bytes.Buffer
	if err := idleChart(&a, pts); err != nil {
		t.Fatal(err)
	}
	if err := idleChart(&b, pts); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Error("the same points drew two different files")
	}
	img, err := png.Decode(bytes.NewReader(a.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	h := histogram(img)
	if nonWhite(img, h) < 0.01 {
		t.Error("the chart is blank")
	}
	for i, s := range []string{"http/sluice", "http/nginx"} {
		if h[curvePalette[i]] == 0 {
			t.Errorf("series %s: no pixel of its colour %v", s, curvePalette[i])
		}
	}
	if err := idleChart(&a, nil); err == nil {
		t.Error("no points drew a chart")
	}
}
