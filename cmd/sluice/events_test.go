package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluicelb/sluice/admission"
	"github.com/sluicelb/sluice/persist"
)

var evT0 = time.Date(2026, 11, 29, 15, 0, 0, 0, time.UTC)

// eventsStore writes events into a new store in a temporary directory and
// returns the directory with the store closed.
func eventsStore(t *testing.T, evs ...admission.Event) string {
	t.Helper()
	dir := t.TempDir()
	s, err := persist.Open(persist.Config{Dir: dir, SweepInterval: -1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range evs {
		s.Append(ev)
	}
	if err := s.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	return dir
}

func runEventsCmd(args ...string) (code int, stdout, stderr string) {
	var out, errb bytes.Buffer
	code = dispatch(append([]string{"events"}, args...), &out, &errb)
	return code, out.String(), errb.String()
}

func TestEventsCommand(t *testing.T) {
	dir := eventsStore(t,
		admission.Event{Time: evT0, Kind: admission.EventMemoryState, Subject: "node", Message: "normal -> low"},
		admission.Event{Time: evT0.Add(time.Minute), Kind: admission.EventARMEngaged, Subject: "invites", Message: "rate 10/min reached"},
		admission.Event{Time: evT0.Add(2 * time.Minute), Kind: admission.EventConfigWarning, Message: "two\nlines"},
	)
	tests := []struct {
		name string
		args []string
		want []string // one substring per output line
	}{
		{"all", nil, []string{"2026-11-29T15:00:00.000Z  memory.state     node  normal -> low", "arm.engaged", `config.warning   -  "two\nlines"`}},
		{"newest", []string{"--limit", "1"}, []string{"config.warning"}},
		{"since", []string{"--since", "2026-11-29T15:01:00Z"}, []string{"arm.engaged", "config.warning"}},
		{"since and limit", []string{"-since=2026-11-29T15:00:00Z", "-limit=2"}, []string{"memory.state", "arm.engaged"}},
		{"limit 0 is all", []string{"--limit", "0"}, []string{"memory.state", "arm.engaged", "config.warning"}},
		{"after the last", []string{"--since", "2026-11-29T16:00:00Z"}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := runEventsCmd(append(tc.args, "--data-dir", dir)...)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, errOut)
			}
			lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
			if out == "" {
				lines = nil
			}
			if len(lines) != len(tc.want) {
				t.Fatalf("got %d lines %q, want %d", len(lines), out, len(tc.want))
			}
			for i, w := range tc.want {
				if !strings.Contains(lines[i], w) {
					t.Errorf("line %d = %q, want it to contain %q", i, lines[i], w)
				}
			}
		})
	}

	code, out, errOut := runEventsCmd("--json", "--data-dir", dir)
	if code != 0 {
		t.Fatalf("--json: exit %d: %s", code, errOut)
	}
	dec := json.NewDecoder(strings.NewReader(out))
	var n int
	for dec.More() {
		var ev admission.Event
		if err := dec.Decode(&ev); err != nil {
			t.Fatalf("--json output %q: %v", out, err)
		}
		if n == 0 && (!ev.Time.Equal(evT0) || ev.Kind != admission.EventMemoryState || ev.Subject != "node") {
			t.Errorf("first JSON event = %+v", ev)
		}
		n++
	}
	if n != 3 {
		t.Errorf("--json printed %d events, want 3", n)
	}
}

func TestEventsCommandErrors(t *testing.T) {
	dir := eventsStore(t)
	tests := []struct {
		name string
		args []string
		code int
		want string
	}{
		{"bad since", []string{"--since", "yesterday", "--data-dir", dir}, 2, "RFC 3339"},
		{"negative limit", []string{"--limit", "-1", "--data-dir", dir}, 2, "--limit"},
		{"argument", []string{"--data-dir", dir, "extra"}, 2, "unexpected argument"},
		{"unknown flag", []string{"--nope"}, 2, "nope"},
		{"no store", []string{"--data-dir", filepath.Join(dir, "missing")}, 1, "no store"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, _, errOut := runEventsCmd(tc.args...)
			if code != tc.code || !strings.Contains(errOut, tc.want) {
				t.Errorf("exit %d %q; want %d containing %q", code, errOut, tc.code, tc.want)
			}
		})
	}
	if code, _, _ := runEventsCmd("-help"); code != 0 {
		t.Errorf("-help: exit %d, want 0", code)
	}
}

func TestEventsCommandWhileRunning(t *testing.T) {
	dir := eventsStore(t)
	s, err := persist.Open(persist.Config{Dir: dir}, nil) // as a running sluice holds it
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	// The admin listener does not answer (a port nothing listens on): the
	// tool says so and prints the curl line.
	admin := freePort(t)
	code, _, errOut := runEventsCmd("--data-dir", dir, "--admin-listen", admin, "--limit", "5")
	if code != 1 || !strings.Contains(errOut, "in use by a running sluice") ||
		!strings.Contains(errOut, "curl 'http://"+admin+"/events?limit=5'") ||
		!strings.Contains(errOut, "(a node whose -admin-listen is not "+admin+": give its address with --admin-listen ADDR, or its file with -config FILE)") {
		t.Fatalf("exit %d %q; want 1 with a curl hint and how to name the node's admin listener", code, errOut)
	}
}

func TestPersistFlags(t *testing.T) {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	var cfg persist.Config
	persistFlags(fs, &cfg)
	if cfg.Dir != persist.DefaultDir || cfg.Interval != 5*time.Second || cfg.EventsRetention != 7*24*time.Hour ||
		cfg.EventsMax != 100000 || cfg.Reset {
		t.Fatalf("defaults: %+v", cfg)
	}
	err := fs.Parse([]string{"-data-dir", "/var/lib/sluice", "-data-reset", "-persist-interval", "2s",
		"-events-retention", "24h", "-events-max", "500", "-history-retention", "48h"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Child == nil {
		t.Fatal("run's store has no store process (persist.Config.Child)")
	}
	cfg.Child = nil
	want := persist.Config{Dir: "/var/lib/sluice", Reset: true, Interval: 2 * time.Second,
		EventsRetention: 24 * time.Hour, EventsMax: 500, HistoryRetention: 48 * time.Hour}
	if fmt.Sprintf("%+v", cfg) != fmt.Sprintf("%+v", want) {
		t.Fatalf("parsed %+v, want %+v", cfg, want)
	}
}

// TestEventsToolTrustsNoFile: `sluice events` reads a data directory it
// does not own as untrusted: a line that does not decode is skipped and
// counted (the rest printed, exit 0), a segment that is a link is not
// followed, a FIFO as the format file does not hang it, and nothing it
// prints points at -data-reset, which would wipe the store.
func TestEventsToolTrustsNoFile(t *testing.T) {
	dir := eventsStore(t,
		admission.Event{Time: evT0, Kind: admission.EventMemoryState, Subject: "node", Message: "normal -> low"},
		admission.Event{Time: evT0.Add(time.Minute), Kind: admission.EventARMEngaged, Subject: "invites", Message: "rate 10/min reached"},
	)
	segs, _ := filepath.Glob(filepath.Join(dir, "events-*.log"))
	if len(segs) != 1 {
		t.Fatalf("segments %v, want one", segs)
	}
	f, err := os.OpenFile(segs[0], os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("{\"not\": \"an event\"}\n")
	f.Close()
	// A link among the segments to a file elsewhere that looks like one.
	secret := filepath.Join(t.TempDir(), "elsewhere.log")
	os.WriteFile(secret, []byte(`{"time":"2026-11-29T15:05:00Z","kind":"secret.kind","subject":"s","message":"read through a link","seq":99}`+"\n"), 0o600)
	if err := os.Symlink(secret, filepath.Join(dir, "events-00000000000000000099.log")); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) (int, string, string) {
		t.Helper()
		type result struct {
			code           int
			stdout, stderr string
		}
		done := make(chan result, 1)
		go func() { c, o, e := runEventsCmd(args...); done <- result{c, o, e} }()
		select {
		case r := <-done:
			return r.code, r.stdout, r.stderr
		case <-time.After(30 * time.Second):
			t.Fatalf("sluice events %v does not return", args)
		}
		return 0, "", ""
	}
	code, out, errOut := run("--data-dir", dir, "--limit", "0")
	if code != 0 || strings.Count(out, "\n") != 2 || !strings.Contains(out, "normal -> low") || !strings.Contains(out, "rate 10/min") {
		t.Errorf("with one bad line: exit %d, stdout %q, stderr %q; want 0 and the two events", code, out, errOut)
	}
	if strings.Contains(out, "read through a link") {
		t.Errorf("printed an event read through a link out of the directory: %q", out)
	}
	if !strings.Contains(errOut, "1 unreadable event lines and 1 unreadable files") || strings.Contains(errOut, "data-reset") {
		t.Errorf("stderr %q: want the count of what was left out, and no -data-reset", errOut)
	}

	fmtFile := filepath.Join(dir, "format")
	os.Remove(fmtFile)
	if err := syscall.Mkfifo(fmtFile, 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, errOut = run("--data-dir", dir)
	if code != 1 || !strings.Contains(errOut, "format") || !strings.Contains(errOut, "not a regular file") || strings.Contains(errOut, "data-reset") {
		t.Errorf("format file a FIFO: exit %d, stderr %q; want 1 naming the format file, no -data-reset", code, errOut)
	}
}

// TestEventsFieldQuotesWhatATerminalRuns: a C1 control (U+009B is CSI in
// many terminals), a bidirectional override or invalid UTF-8 from the
// event log is printed quoted, never raw; ordinary text, accents included,
// as it is.
func TestEventsFieldQuotesWhatATerminalRuns(t *testing.T) {
	for in, want := range map[string]string{
		"b1\u009b2J":     `"b1\u009b2J"`,
		"h1 \u202enwod":  `"h1 \u202enwod"`,
		"bad \xff byte":  `"bad \xff byte"`,
		"esc \x1b[2J":    `"esc \x1b[2J"`,
		"h1 up -> down":  "h1 up -> down",
		"mémoire à 85 %": "mémoire à 85 %",
		"":               "-",
	} {
		if got := eventsField(in); got != want {
			t.Errorf("eventsField(%q) = %s, want %s", in, got, want)
		}
	}
}

// `sluice events -config FILE` with the node's own file stopped at its
// first line ("unknown flag http-listen"): the run flags it does not have
// are skipped now, and -data-dir comes from the file.
func TestEventsReadsTheNodeConfig(t *testing.T) {
	dir := eventsStore(t, admission.Event{Time: evT0, Kind: "config.reload", Subject: "f", Message: "backends reloaded"})
	conf := filepath.Join(t.TempDir(), "sluice.conf")
	if err := os.WriteFile(conf, []byte("http-listen :8080\nhttp-backend 10.0.0.1:80\ndata-dir "+dir+"\nmem-limit 1GiB\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := runEventsCmd("-config", conf)
	if code != 0 || !strings.Contains(out, "backends reloaded") {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if err := os.WriteFile(conf, []byte("data-dir "+dir+"\nfrobnicate 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, _, errOut := runEventsCmd("-config", conf); code != 2 || !strings.Contains(errOut, `unknown flag "frobnicate"`) {
		t.Errorf("a flag of no command: exit %d, stderr %q", code, errOut)
	}
}

// TestEventsCommandRefusesAnotherNodesLog: while the data directory is in
// use, the log is read from --admin-listen; when the sluice answering
// there runs on another data directory (its admin listener is the
// default 127.0.0.1:9090 and this node's is not), its events were printed
// as this directory's. Now the tool says which directory that node runs
// on and prints none of them; a node on this directory, named by a
// relative or an absolute path, or one whose /status does not say, is
// read as before.
func TestEventsCommandRefusesAnotherNodesLog(t *testing.T) {
	dir := eventsStore(t)
	s, err := persist.Open(persist.Config{Dir: dir}, nil) // as a running sluice holds it
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	other := t.TempDir()
	rel, err := filepath.Rel(mustGetwd(t), dir)
	if err != nil {
		t.Fatal(err)
	}
	page, _ := json.Marshal(persist.EventsPage{Events: []admission.Event{
		{Time: time.Date(2026, 12, 1, 22, 0, 0, 0, time.UTC), Kind: "node.started", Subject: "its node", Message: "started"}}})
	cases := []struct {
		name, statusDir string
		noStorage       bool
		code            int
		out, errOut     string
	}{
		{"another node", other, false, 1, "", "runs on " + other + ", another one: its events are not printed"},
		{"this node", dir, false, 0, "node.started", ""},
		{"this node, path with a trailing slash", dir + "/", false, 0, "node.started", ""},
		{"a relative path: cannot tell", rel, false, 0, "node.started", ""},
		{"no storage in /status: cannot tell", "", true, 0, "node.started", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				switch r.URL.Path {
				case "/status":
					if c.noStorage {
						fmt.Fprint(w, `{"memory_state":"normal"}`)
						return
					}
					json.NewEncoder(w).Encode(map[string]any{"storage": map[string]any{"dir": c.statusDir}})
				case "/events":
					w.Write(page)
				}
			}))
			defer srv.Close()
			// The address as --admin-listen spells it, and as sluice
			// ctl's -admin does (a URL).
			for _, spelling := range [][]string{{"--admin-listen", srv.Listener.Addr().String()}, {"-admin", srv.URL + "/"}} {
				code, out, errOut := runEventsCmd(append([]string{"--data-dir", dir}, spelling...)...)
				if code != c.code || !strings.Contains(out, c.out) || !strings.Contains(errOut, c.errOut) ||
					(c.code != 0) != (out == "") {
					t.Errorf("%s: exit %d, stdout %q, stderr %q; want exit %d, stdout with %q, stderr with %q", spelling, code, out, errOut, c.code, c.out, c.errOut)
				}
			}
		})
	}
}

func mustGetwd(t *testing.T) string {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	return wd
}
