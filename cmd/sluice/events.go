package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	sadmin "github.com/sluicelb/sluice/admin"
	"github.com/sluicelb/sluice/admission"
	"github.com/sluicelb/sluice/persist"
)

func init() {
	register("events", "print the event log from the data directory", runEvents)
}

func runEvents(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("events", stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: sluice events [--since TIME] [--type KIND] [--subject S] [--limit N] [--data-dir DIR] [--json]")
		fmt.Fprintln(stderr, "\nPrints the event log from the data directory, oldest first: time, kind, subject")
		fmt.Fprintln(stderr, "and message. While sluice runs (it holds the directory), the log is read from its")
		fmt.Fprintln(stderr, "admin listener (--admin-listen), as curl http://ADMIN/events?since=TIME&type=KIND would.")
		fs.PrintDefaults()
	}
	dir := fs.String("data-dir", persist.DefaultDir,
		"data directory to read")
	sinceFlag := fs.String("since", "",
		"print events at or after TIME: RFC 3339 (2026-11-29T15:04:05Z) or a duration before now (15m);\n"+
			"without it, the newest --limit events")
	limit := fs.Int("limit", persist.DefaultEventsLimit, "most events to print; 0 prints all")
	asJSON := fs.Bool("json", false, "print one JSON object per line")
	kind := fs.String("type", "", "print only events of this kind (mop.learned, backend.down, persist.child_died, ...)")
	subject := fs.String("subject", "", "print only events of this subject (a backend: \"http 127.0.0.1:18081\")")
	admin := fs.String("admin-listen", sadmin.DefaultListen,
		"admin address of the running sluice, read when the store is in use")
	// -admin as sluice ctl spells it (a URL or host:port), so the same
	// address works for both commands.
	fs.StringVar(admin, "admin", sadmin.DefaultListen, "the same as --admin-listen, spelt as sluice ctl spells it: a URL (http://HOST:PORT) or host:port (env SLUICE_ADMIN)")
	if v := os.Getenv("SLUICE_ADMIN"); v != "" {
		*admin = v
	}
	if code, ok := parseCommand("events", fs, args, stderr); !ok {
		return code
	}
	*admin = strings.TrimSuffix(strings.TrimPrefix(*admin, "http://"), "/")
	bad := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "sluice events: "+format+"\n", a...)
		return 2
	}
	if *limit < 0 {
		return bad("--limit must not be negative")
	}
	since, err := persist.ParseSince(*sinceFlag, time.Now())
	if err != nil {
		return bad("--%v", err)
	}

	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	s, err := persist.Open(persist.Config{Dir: *dir, ReadOnly: true}, logger)
	switch {
	case errors.Is(err, persist.ErrLocked):
		q := url.Values{}
		q.Set("limit", strconv.Itoa(min(max(*limit, 1), persist.MaxEventsLimit)))
		if *sinceFlag != "" {
			q.Set("since", since.Format(time.RFC3339Nano))
		}
		if *kind != "" {
			q.Set("type", *kind)
		}
		if *subject != "" {
			q.Set("subject", *subject)
		}
		if other := adminDataDir("http://"+*admin+"/status", *dir); other != "" {
			fmt.Fprintf(stderr, "sluice events: data directory %s is in use, but the sluice at --admin-listen %s runs on %s, another one: its events are not printed\n", *dir, *admin, eventsField(other))
			fmt.Fprintf(stderr, "(give the admin address of the node on %s with --admin-listen ADDR, or its file with -config FILE)\n", *dir)
			return 1
		}
		evs, ferr := fetchEvents("http://" + *admin + "/events?" + q.Encode())
		if ferr == nil {
			return printEvents(stdout, stderr, evs, *asJSON)
		}
		fmt.Fprintf(stderr, "sluice events: data directory %s is in use by a running sluice, and its admin listener %s did not answer (%v); read its event log with\n", *dir, *admin, ferr)
		fmt.Fprintf(stderr, "  curl 'http://%s/events?limit=%d'\n", *admin, max(*limit, 1))
		fmt.Fprintf(stderr, "(a node whose -admin-listen is not %s: give its address with --admin-listen ADDR, or its file with -config FILE)\n", *admin)
		return 1
	case err != nil:
		fmt.Fprintf(stderr, "sluice events: -data-dir: %v\n", err)
		return 1
	}
	defer s.Close(context.Background())

	var evs []admission.Event
	if *kind != "" || *subject != "" {
		evs, _, _, err = s.Query(persist.EventQuery{Since: since, Kind: *kind, Subject: *subject,
			Limit: *limit, Newest: *sinceFlag == ""})
	} else if *sinceFlag == "" && *limit > 0 {
		evs, err = s.Tail(*limit)
	} else {
		evs, err = s.Events(since, *limit)
	}
	if err != nil {
		fmt.Fprintf(stderr, "sluice events: %v\n", err)
		return 1
	}
	if sk := s.Skipped(); sk.Lines > 0 || sk.Files > 0 {
		// A read problem: the rest is printed, nothing in the directory
		// is changed, and nothing is to be wiped for it.
		defer fmt.Fprintf(stderr, "sluice events: %d unreadable event lines and %d unreadable files in %s left out; the other events are printed\n", sk.Lines, sk.Files, *dir)
	}
	return printEvents(stdout, stderr, evs, *asJSON)
}

// adminDataDir returns the data directory the sluice whose /status is at
// u reports when it is not dir (another node answers on that admin
// address: its events would be printed as dir's), and "" when it is dir
// or that cannot be told (no answer, no storage, a relative path from a
// node of before the path was made absolute): fetchEvents then reports
// what it finds.
func adminDataDir(u, dir string) string {
	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get(u)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return ""
	}
	var st struct {
		Storage *struct {
			Dir string `json:"dir"`
		} `json:"storage"`
	}
	if json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(&st) != nil || st.Storage == nil {
		return ""
	}
	other := st.Storage.Dir
	if !filepath.IsAbs(other) {
		return ""
	}
	mine, err1 := os.Stat(dir)
	theirs, err2 := os.Stat(other)
	if err1 == nil && err2 == nil && os.SameFile(mine, theirs) {
		return ""
	}
	if abs, err := filepath.Abs(dir); err == nil && filepath.Clean(abs) == filepath.Clean(other) {
		return ""
	}
	return other
}

// fetchEvents reads /events of a running sluice (at most 64 MiB).
func fetchEvents(u string) ([]admission.Event, error) {
	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get(u)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(body)))
	}
	var page persist.EventsPage
	if err := json.Unmarshal(body, &page); err != nil {
		return nil, fmt.Errorf("decoding the answer: %w", err)
	}
	return page.Events, nil
}

func printEvents(stdout, stderr io.Writer, evs []admission.Event, asJSON bool) int {
	if asJSON {
		enc := json.NewEncoder(stdout)
		for _, ev := range evs {
			if err := enc.Encode(ev); err != nil {
				fmt.Fprintf(stderr, "sluice events: %v\n", err)
				return 1
			}
		}
		return 0
	}
	for _, ev := range evs {
		fmt.Fprintf(stdout, "%s  %-16s %s  %s\n", ev.Time.Format("2006-01-02T15:04:05.000Z07:00"),
			eventsField(string(ev.Kind)), eventsField(ev.Subject), eventsField(ev.Message))
	}
	return 0
}

// persistFlags registers the flags of persist.Config on fs, for the run
// command: -data-dir, -data-reset, -persist-interval, -events-retention and
// -events-max, with their defaults and units. Environment twins
// (SLUICE_DATA_DIR, ...) are applied by the caller like those of every
// other flag.
func persistFlags(fs *flag.FlagSet, cfg *persist.Config) {
	fs.StringVar(&cfg.Dir, "data-dir", persist.DefaultDir,
		"data directory for learned MOP rates, run-time changes (sluice ctl), the event log, the SIP dialog table, the dashboard's history and (without -affinity-key-file) the affinity key; one node each")
	fs.BoolVar(&cfg.Reset, "data-reset", false,
		"wipe the store in -data-dir at start (learned rates, run-time changes, events, stored SIP dialogs and history are lost; the affinity key stays); use when it cannot be opened")
	fs.DurationVar(&cfg.Interval, "persist-interval", persist.DefaultInterval,
		"how often learned MOP rates are saved; at most this much learning is lost on kill -9")
	fs.DurationVar(&cfg.EventsRetention, "events-retention", persist.DefaultEventsRetention,
		"how long events are kept (negative: no age limit)")
	fs.IntVar(&cfg.EventsMax, "events-max", persist.DefaultEventsMax,
		"most events kept; the oldest beyond it are deleted (negative: no limit)")
	fs.DurationVar(&cfg.HistoryRetention, "history-retention", persist.DefaultHistoryRetention,
		"how long the dashboard's history is kept in the store")
	// The store is a Badger database in a store process (format 3); it
	// needs Linux (socketpair, parent-death signal), elsewhere format 2.
	if runtime.GOOS == "linux" {
		cfg.Child = storeChildCommand
	}
}

// eventsField prints "-" for an empty field and quotes one that holds a
// character a terminal would not print as itself (C0 and C1 controls, the
// bidirectional overrides, invalid UTF-8), so that one event stays on one
// line and no escape sequence from the log reaches the terminal.
func eventsField(s string) string {
	switch {
	case s == "":
		return "-"
	case !utf8.ValidString(s) || strings.ContainsFunc(s, func(r rune) bool { return r != ' ' && !strconv.IsPrint(r) }):
		return strconv.Quote(s)
	}
	return s
}
