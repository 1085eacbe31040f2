package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

func TestSimulateSeedJSON(t *testing.T) {
	var out, errb bytes.Buffer
	code := dispatch([]string{"simulate", "--limit", "10/min", "--arrivals", "1,2,2,3,2,1,3,0,0,0", "--json"}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var rows []map[string]any
	if err := json.Unmarshal(out.Bytes(), &rows); err != nil {
		t.Fatalf("output is not a JSON array: %v\n%s", err, out.String())
	}
	wantRate := []float64{1, 3, 5, 8, 10, 10, 10, 10, 9, 6}
	wantQueue := []float64{0, 0, 0, 0, 0, 1, 3, 1, 0, 0}
	keys := []string{"interval", "start", "arrived", "admitted", "released", "refused", "rate", "queued"}
	if len(rows) != 10 {
		t.Fatalf("%d rows, want 10", len(rows))
	}
	for i, r := range rows {
		if len(r) != len(keys) {
			t.Errorf("row %d has keys %v, want exactly %v", i, r, keys)
		}
		for _, k := range keys {
			if _, ok := r[k]; !ok {
				t.Errorf("row %d lacks %q", i, k)
			}
		}
		if r["interval"] != float64(i+1) || r["rate"] != wantRate[i] || r["queued"] != wantQueue[i] {
			t.Errorf("row %d: %v, want rate %v queued %v", i, r, wantRate[i], wantQueue[i])
		}
	}
	if rows[6]["start"] != "1m0s" || rows[6]["released"] != float64(1) {
		t.Errorf("row 7: %v", rows[6])
	}
}

func TestSimulateTable(t *testing.T) {
	var out, errb bytes.Buffer
	if code := dispatch([]string{"simulate", "--limit", "10/min", "--arrivals", "1,2,2,3,2,1,3,0,0,0"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	last := strings.Fields(lines[len(lines)-1])
	if want := []string{"10", "+1m30s", "0", "0", "0", "0", "6", "0"}; strings.Join(last, " ") != strings.Join(want, " ") {
		t.Errorf("last row %v, want %v", last, want)
	}
}

func TestSimulateBadInput(t *testing.T) {
	for _, tc := range []struct {
		args []string
		flag string
	}{
		{[]string{"--limit", "10/day", "--arrivals", "1"}, "--limit"},
		{[]string{"--limit", "ten/min", "--arrivals", "1"}, "--limit"},
		{[]string{"--arrivals", "1"}, "--limit"},
		{[]string{"--limit", "10/min", "--arrivals", "1,-2"}, "--arrivals"},
		{[]string{"--limit", "10/min", "--arrivals", "1,x"}, "--arrivals"},
		{[]string{"--limit", "10/min", "--arrivals", "1", "--action", "drop"}, "--action"},
		{[]string{"--limit", "10/min", "--arrivals", "1", "--queue", "0"}, "--queue"},
		{[]string{"--limit", "10/min", "--arrivals", "1", "--qualify", "-1s"}, "--qualify"},
	} {
		var out, errb bytes.Buffer
		code := dispatch(append([]string{"simulate"}, tc.args...), &out, &errb)
		if code != 2 || !strings.Contains(errb.String(), tc.flag) {
			t.Errorf("%v: exit %d, stderr %q; want 2 and a message naming %s", tc.args, code, errb.String(), tc.flag)
		}
	}
}

func TestUnknownCommand(t *testing.T) {
	var out, errb bytes.Buffer
	if code := dispatch([]string{"bogus"}, &out, &errb); code != 2 || !strings.Contains(errb.String(), "bogus") {
		t.Errorf("exit %d, stderr %q", code, errb.String())
	}
}

func TestHelpGroupsFlags(t *testing.T) {
	var out, errb bytes.Buffer
	if code := dispatch([]string{"--help"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d", code)
	}
	s := out.String()
	last := -1
	for _, section := range []string{"HTTP front end:", "SIP front end:", "ARM rules", "MOP (memory", "Node memory states:", "Persistence and event log:", "Operations:"} {
		i := strings.Index(s, section)
		if i < 0 || i < last {
			t.Errorf("section %q missing or out of order", section)
		}
		last = i
	}
	for _, want := range []string{"-mop-window", "(default 1m0s)", "-sip-listen", "-drain-timeout", "SLUICE_HTTP_LISTEN"} {
		if !strings.Contains(s, want) {
			t.Errorf("help lacks %q", want)
		}
	}
	out.Reset()
	if code := dispatch([]string{"version"}, &out, &errb); code != 0 || !strings.HasPrefix(out.String(), "sluice ") {
		t.Errorf("version: %d %q", code, out.String())
	}
}

func TestSimulateMOP(t *testing.T) {
	var out, errb bytes.Buffer
	args := []string{"simulate", "--mop", "base=10%,bytes=1MiB,lifetime=30s,max-heap=1GiB,rate=100,ceiling=0.5,window=30s,windows=4", "--json"}
	if code := dispatch(args, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var rows []map[string]any
	if err := json.Unmarshal(out.Bytes(), &rows); err != nil {
		t.Fatalf("output is not a JSON array: %v\n%s", err, out.String())
	}
	if len(rows) != 4 {
		t.Fatalf("%d windows, want 4", len(rows))
	}
	for i, r := range rows {
		for _, k := range []string{"window", "allowed_rate", "admitted", "refused", "memory", "peak_memory"} {
			if _, ok := r[k]; !ok {
				t.Errorf("window %d lacks %q: %v", i+1, k, r)
			}
		}
		if got := r["admitted"].(float64) + r["refused"].(float64); got != 3000 {
			t.Errorf("window %d offered %v, want 3000 (100/s for 30s)", i+1, got)
		}
		if r["peak_memory"].(float64) > 0.52 {
			t.Errorf("window %d: peak memory %v over the ceiling 0.50 by more than 2 points", i+1, r["peak_memory"])
		}
	}

	out.Reset()
	if code := dispatch(args[:3], &out, &errb); code != 0 || !strings.Contains(out.String(), "allowed/s") {
		t.Errorf("table: exit %d, output %q", code, out.String())
	}
}

func TestSimulateMOPBadInput(t *testing.T) {
	for _, spec := range []string{"base=1m", "base=1m,bytes=1k,lifetime=1s,max-heap=1g,rate=fast", "base=1m,bytes=1k,lifetime=1s,max-heap=1g,rate=1,shade=blue"} {
		var out, errb bytes.Buffer
		code := dispatch([]string{"simulate", "--mop=" + spec}, &out, &errb)
		if code != 2 || !strings.Contains(errb.String(), "--mop") {
			t.Errorf("--mop %q: exit %d, stderr %q; want 2 and a message naming the flag", spec, code, errb.String())
		}
	}
	var out, errb bytes.Buffer
	dispatch([]string{"simulate", "-help"}, &out, &errb)
	if !strings.Contains(errb.String(), "--mop") || !strings.Contains(errb.String(), "max-heap=SIZE") {
		t.Errorf("help does not document --mop:\n%s", errb.String())
	}
}

// TestSimulateMOPSaysWhenMemoryRunsOut: a peak over the backend's max
// heap (a deploy that triples the memory of a session: its first second,
// before memory shows the new sessions) is said in words beside the
// percentages; one under it is not.
func TestSimulateMOPSaysWhenMemoryRunsOut(t *testing.T) {
	const outOfMemory = "over its max heap: the backend would have run out of memory"
	cases := []struct {
		spec string
		want bool
	}{
		{"base=100MiB,bytes=1MiB,lifetime=2s,max-heap=1GiB,rate=450,windows=4,deploy=3m,deploy-bytes=3MiB", true},
		{"base=10%,bytes=1MiB,lifetime=30s,max-heap=1GiB,rate=100,ceiling=0.5,window=30s,windows=4", false},
	}
	for _, c := range cases {
		var out, errb bytes.Buffer
		if code := dispatch([]string{"simulate", "--mop", c.spec}, &out, &errb); code != 0 {
			t.Fatalf("%s: exit %d: %s", c.spec, code, errb.String())
		}
		if got := strings.Contains(out.String(), outOfMemory); got != c.want {
			t.Errorf("%s: says %q: %v, want %v\n%s", c.spec, outOfMemory, got, c.want, out.String())
		}
	}
}
