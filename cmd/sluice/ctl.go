package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"os"
	"strings"
	"sync/atomic"
	"text/tabwriter"
	"time"
	"unicode"

	"github.com/sluicelb/sluice/admin"
	"github.com/sluicelb/sluice/internal/opfile"
)

func init() {
	register("ctl", "change a running sluice: drain or weigh backends, reset or pin MOP rates, change arm rules (admin listener client)", runCtl)
}

// Exit codes of sluice ctl, for scripts.
const (
	ctlOK          = 0 // the change was made (or the answer printed)
	ctlRefused     = 1 // the admin listener refused it; its message is printed
	ctlUsage       = 2 // bad command line
	ctlUnreachable = 3 // the admin listener could not be reached
	// ctlNoAnswer: connected, but no answer came (timed out, or the
	// connection broke): a change may have been applied.
	ctlNoAnswer = 4
)

const ctlUsageText = `usage: sluice ctl [-admin URL] [-token-file FILE] [-protocol http|sip] COMMAND ARGS
(ctl's flags may also follow the command; -- ends them, for an argument that starts with -)

commands:
  status                     memory state, backends by pool, routes with their hits and ARM rules
  config                     the running configuration (config-file syntax)
  drain ID | undrain ID      stop / resume new work to a backend (affinity continues)
  disable ID | enable ID     take a backend out entirely (no affinity either) / back
  weight ID N                set a backend's weight (1-1000)
  mop reset ID               forget a backend's learned rate (discovery again)
  mop pin ID RATE            hold a backend's MOP rate at RATE requests/s
  mop unpin ID               learn again from the rate before the pin
  arm set NAME KEY=VALUE...  change a rule: limit=500/s action=reject ...
  arm add RULE               add a rule in the -arm grammar: name=x,limit=10/s,...
  arm remove NAME            remove a rule
  route list                 the routes of both front ends, in order, with their hits
  route add PROTO SPEC [AT]  add a route (http or sip; -http-route / -sip-route grammar),
                             at position AT (0: first; default last)
  route remove PROTO INDEX   remove a route by its index in route list
  drain-pool NAME            drain every backend of a pool (-protocol when both front ends have it)
  undrain-pool NAME          undrain them

exit status: 0 done, 1 refused by sluice (its message on stderr),
2 usage error, 3 admin listener not reachable, 4 connected but no answer
(timed out: a change may have been applied; check before retrying).
`

// ctlCall is one request a command makes.
type ctlCall struct {
	method, path, value string
}

// parseCtl turns the command words into a request.
func parseCtl(args []string, protocol string) (ctlCall, error) {
	need := func(n int, form string) error {
		if len(args) != n {
			return fmt.Errorf("%s: want %s", args[0], form)
		}
		return nil
	}
	q := ""
	if protocol != "" {
		q = "?protocol=" + url.QueryEscape(protocol)
	}
	backend := func(id, action string) string {
		return "/control/backends/" + url.PathEscape(id) + "/" + action + q
	}
	if len(args) == 0 {
		return ctlCall{}, errors.New("no command")
	}
	switch args[0] {
	case "status":
		return ctlCall{"GET", "/status", ""}, need(1, "no arguments")
	case "config":
		return ctlCall{"GET", "/control/config", ""}, need(1, "no arguments")
	case "drain", "undrain", "disable", "enable":
		if err := need(2, args[0]+" ID"); err != nil {
			return ctlCall{}, err
		}
		return ctlCall{"POST", backend(args[1], args[0]), ""}, nil
	case "weight":
		if err := need(3, "weight ID N"); err != nil {
			return ctlCall{}, err
		}
		return ctlCall{"POST", backend(args[1], "weight"), args[2]}, nil
	case "mop":
		if len(args) < 2 {
			return ctlCall{}, errors.New("mop: want mop reset ID, mop pin ID RATE or mop unpin ID")
		}
		switch args[1] {
		case "reset", "unpin":
			if len(args) != 3 {
				return ctlCall{}, fmt.Errorf("mop %s: want mop %s ID", args[1], args[1])
			}
			return ctlCall{"POST", backend(args[2], "mop/"+args[1]), ""}, nil
		case "pin":
			if len(args) != 4 {
				return ctlCall{}, errors.New("mop pin: want mop pin ID RATE")
			}
			return ctlCall{"POST", backend(args[2], "mop/pin"), args[3]}, nil
		}
		return ctlCall{}, fmt.Errorf("mop %s: want reset, pin or unpin", args[1])
	case "arm":
		if len(args) < 2 {
			return ctlCall{}, errors.New("arm: want arm set NAME KEY=VALUE..., arm add RULE or arm remove NAME")
		}
		switch args[1] {
		case "set":
			if len(args) < 4 {
				return ctlCall{}, errors.New("arm set: want arm set NAME KEY=VALUE... (e.g. limit=500/s)")
			}
			return ctlCall{"POST", "/control/arm/" + url.PathEscape(args[2]) + "/set", strings.Join(args[3:], ",")}, nil
		case "add":
			if len(args) < 3 {
				return ctlCall{}, errors.New("arm add: want arm add RULE (e.g. name=api,limit=10/s)")
			}
			return ctlCall{"POST", "/control/arm/add", strings.Join(args[2:], ",")}, nil
		case "remove":
			if len(args) != 3 {
				return ctlCall{}, errors.New("arm remove: want arm remove NAME")
			}
			return ctlCall{"POST", "/control/arm/" + url.PathEscape(args[2]) + "/remove", ""}, nil
		}
		return ctlCall{}, fmt.Errorf("arm %s: want set, add or remove", args[1])
	case "route":
		if len(args) < 2 {
			return ctlCall{}, errors.New("route: want route list, route add PROTO SPEC [AT] or route remove PROTO INDEX")
		}
		proto := func(p string) error {
			if p != "http" && p != "sip" {
				return fmt.Errorf("route %s: protocol %q: want http or sip", args[1], p)
			}
			return nil
		}
		switch args[1] {
		case "list":
			return ctlCall{"GET", "/control/routes", ""}, need(2, "route list")
		case "add":
			if len(args) != 4 && len(args) != 5 {
				return ctlCall{}, errors.New("route add: want route add PROTO SPEC [AT] (e.g. route add http pool=api,host=api.example.com 0)")
			}
			if err := proto(args[2]); err != nil {
				return ctlCall{}, err
			}
			path := "/control/routes/" + args[2] + "/add"
			if len(args) == 5 {
				path += "?at=" + url.QueryEscape(args[4])
			}
			return ctlCall{"POST", path, args[3]}, nil
		case "remove":
			if len(args) != 4 {
				return ctlCall{}, errors.New("route remove: want route remove PROTO INDEX")
			}
			if err := proto(args[2]); err != nil {
				return ctlCall{}, err
			}
			return ctlCall{"POST", "/control/routes/" + args[2] + "/" + url.PathEscape(args[3]) + "/remove", ""}, nil
		}
		return ctlCall{}, fmt.Errorf("route %s: want list, add or remove", args[1])
	case "drain-pool", "undrain-pool":
		if err := need(2, args[0]+" NAME"); err != nil {
			return ctlCall{}, err
		}
		return ctlCall{"POST", "/control/pools/" + url.PathEscape(args[1]) + "/" + strings.TrimSuffix(args[0], "-pool") + q, ""}, nil
	}
	return ctlCall{}, fmt.Errorf("unknown command %q", args[0])
}

// ctlWords returns the command words left after fs parsed the flags
// before the command, parsing the flags of fs given after it too
// ("sluice ctl drain-pool default -protocol sip"): the flag package stops
// at the first word. A word after the command that looks like a flag but
// is none of ctl's is refused, naming it, rather than taken for an
// argument; "--" ends the flags (for an argument that starts with "-").
func ctlWords(fs *flag.FlagSet) ([]string, error) {
	var words []string
	rest := fs.Args()
	for len(rest) > 0 {
		w := rest[0]
		if w == "--" {
			return append(words, rest[1:]...), nil
		}
		name, isFlag := strings.CutPrefix(w, "-")
		if !isFlag || name == "" {
			words = append(words, w)
			rest = rest[1:]
			continue
		}
		name = strings.TrimPrefix(name, "-")
		name, _, _ = strings.Cut(name, "=")
		if fs.Lookup(name) == nil {
			cmd := "the command"
			if len(words) > 0 {
				cmd = words[0]
			}
			return nil, fmt.Errorf("%s after %s: flags go before the command: sluice ctl [flags] COMMAND ... (no flag %s; use -- before an argument that starts with -)", w, cmd, w)
		}
		if err := fs.Parse(rest); err != nil {
			return nil, err
		}
		rest = fs.Args()
	}
	return words, nil
}

// readCtlToken reads the token to present from a token file: the first
// token in it (the TOKEN of a "NAME TOKEN" line, or a line alone).
func readCtlToken(path string) (string, error) {
	data, err := opfile.Read(path, opfile.MaxSize)
	if err != nil {
		return "", fmt.Errorf("-token-file: %w", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 || strings.HasPrefix(f[0], "#") {
			continue
		}
		return f[len(f)-1], nil
	}
	return "", fmt.Errorf("-token-file %s: no token in the file", path)
}

func runCtl(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("ctl", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, ctlUsageText, "\nflags:\n"); fs.PrintDefaults() }
	adminURL := fs.String("admin", envOr("SLUICE_ADMIN", "http://"+admin.DefaultListen), "the admin listener, URL or host:port (env SLUICE_ADMIN)")
	tokenFile := fs.String("token-file", os.Getenv("SLUICE_TOKEN_FILE"), "`file` with the bearer token to present (its first token; env SLUICE_TOKEN_FILE)")
	protocol := fs.String("protocol", "", "`protocol` of the backend (http or sip) when its id is used by both")
	timeout := fs.Duration("timeout", 10*time.Second, "give up on the admin listener after this long")
	if err := fs.Parse(args); err != nil {
		return ctlUsage
	}
	words, err := ctlWords(fs)
	if err != nil {
		fmt.Fprintf(stderr, "sluice ctl: %v\n", err)
		return ctlUsage
	}
	if *protocol != "" && *protocol != "http" && *protocol != "sip" {
		fmt.Fprintf(stderr, "sluice ctl: -protocol %q: want http or sip\n", *protocol)
		return ctlUsage
	}
	call, err := parseCtl(words, *protocol)
	if err != nil {
		fmt.Fprintf(stderr, "sluice ctl: %v\n\n%s", err, ctlUsageText)
		return ctlUsage
	}
	base := strings.TrimRight(*adminURL, "/")
	if !strings.Contains(base, "://") {
		base = "http://" + base
	}
	if u, err := url.Parse(base); err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		fmt.Fprintf(stderr, "sluice ctl: -admin %q: want http://HOST:PORT\n", *adminURL)
		return ctlUsage
	}
	token := ""
	if *tokenFile != "" {
		if token, err = readCtlToken(*tokenFile); err != nil {
			fmt.Fprintf(stderr, "sluice ctl: %v\n", err)
			return ctlUsage
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	var body io.Reader
	if call.value != "" {
		body = strings.NewReader(url.Values{"value": {call.value}}.Encode())
	}
	req, err := http.NewRequestWithContext(ctx, call.method, base+call.path, body)
	if err != nil {
		fmt.Fprintf(stderr, "sluice ctl: %v\n", err)
		return ctlUsage
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	// Whether a connection was made: a request that then gets no answer
	// reached sluice, which may have applied it.
	var connected atomic.Bool
	req = req.WithContext(httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		GotConn: func(httptrace.GotConnInfo) { connected.Store(true) },
	}))
	resp, err := ctlClient.Do(req)
	if errors.Is(err, errCtlRedirect) {
		fmt.Fprintf(stderr, "sluice ctl: refused: %s\n", safeText(errors.Unwrap(err).Error()))
		return ctlRefused
	}
	if err != nil {
		if connected.Load() {
			return ctlNoAnswerText(stderr, base, call, *adminURL, *timeout, err)
		}
		fmt.Fprintf(stderr, "sluice ctl: admin listener %s not reachable: %v\n(is sluice running? its -admin-listen address goes in -admin)\n", base, err)
		return ctlUnreachable
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		// It answered: whatever it did is done; only its text is lost.
		fmt.Fprintf(stderr, "sluice ctl: reading the answer of %s (%d %s): %v\n", base, resp.StatusCode, http.StatusText(resp.StatusCode), err)
		return ctlNoAnswer
	}
	if resp.StatusCode/100 != 2 {
		fmt.Fprintf(stderr, "sluice ctl: refused (%d %s): %s\n", resp.StatusCode, http.StatusText(resp.StatusCode), strings.TrimSpace(safeText(string(data))))
		if resp.StatusCode == http.StatusMisdirectedRequest {
			fmt.Fprintf(stderr, "(reach it by the address of its -admin-listen, or start it with -admin-host %s)\n", safeField(req.URL.Hostname()))
		}
		return ctlRefused
	}
	if call.path == "/control/routes" {
		if err := printRoutes(stdout, data); err != nil {
			fmt.Fprintf(stderr, "sluice ctl: routes from %s: %v\n", base, err)
			return ctlRefused
		}
		return ctlOK
	}
	if call.path == "/status" {
		if err := printStatus(stdout, data); err != nil {
			fmt.Fprintf(stderr, "sluice ctl: status from %s: %v\n", base, err)
			return ctlRefused
		}
		return ctlOK
	}
	io.WriteString(stdout, safeText(string(data)))
	return ctlOK
}

// ctlNoAnswerText explains a request that reached the admin listener
// and got no answer (err): it timed out or the connection broke. A change
// (POST) may have been applied all the same: the operator is told to look
// before retrying, never that sluice may not be running.
func ctlNoAnswerText(stderr io.Writer, base string, call ctlCall, adminFlag string, timeout time.Duration, err error) int {
	why := fmt.Sprintf("the connection broke before its answer (%v)", err)
	if errors.Is(err, context.DeadlineExceeded) {
		why = fmt.Sprintf("no answer within -timeout %s", timeout)
	}
	if call.method != http.MethodPost {
		fmt.Fprintf(stderr, "sluice ctl: timed out waiting for sluice at %s: %s\n", base, why)
		return ctlNoAnswer
	}
	check := "status"
	if strings.HasPrefix(call.path, "/control/routes/") {
		check = "route list"
	}
	fmt.Fprintf(stderr, "sluice ctl: timed out waiting for sluice at %s: %s: the change may have been applied; check with `sluice ctl -admin %s %s` before retrying\n", base, why, adminFlag, check)
	return ctlNoAnswer
}

// errCtlRedirect: the admin listener answered with a redirect. sluice ctl
// never follows one: it would carry the bearer token (and the change) to
// wherever the answer points, another port or host included.
var errCtlRedirect = errors.New("redirect not followed")

// ctlClient is the HTTP client of sluice ctl: no redirects.
var ctlClient = &http.Client{CheckRedirect: func(req *http.Request, via []*http.Request) error {
	return fmt.Errorf("%w: %w", errCtlRedirect, fmt.Errorf("the admin listener answered with a redirect to %s; sluice ctl does not follow redirects (its token goes only to -admin)", req.URL.Redacted()))
}}

// safeText is text from the admin listener made safe for a terminal:
// control characters (escape sequences, carriage returns, bells) but
// newline and tab are removed, as are the bidirectional overrides that
// make text read otherwise than it is; invalid UTF-8 becomes U+FFFD.
func safeText(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	return strings.Map(func(r rune) rune {
		switch {
		case r == '\n' || r == '\t':
			return r
		case unicode.IsControl(r), r >= 0x202A && r <= 0x202E, r >= 0x2066 && r <= 0x2069:
			return -1
		}
		return r
	}, s)
}

// safeField is safeText for one cell of a table: no newline or tab either.
func safeField(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '\n' || r == '\t' {
			return ' '
		}
		return r
	}, safeText(s))
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// printStatus prints /status as two tables.
func printStatus(w io.Writer, data []byte) error {
	var st admin.Status
	if err := json.Unmarshal(data, &st); err != nil {
		return err
	}
	if st.Memory.LimitBytes > 0 {
		fmt.Fprintf(w, "memory %s (%d of %d bytes)\n\n", safeField(st.MemoryState), st.Memory.UsedBytes, st.Memory.LimitBytes)
	} else {
		// No limit: the states never leave normal ("of 0 bytes" read as
		// a limit of nothing).
		fmt.Fprintf(w, "memory states off: no -mem-limit, cgroup limit or GOMEMLIMIT (%d bytes used)\n\n", st.Memory.UsedBytes)
	}
	// A reload that failed or dropped run-time changes: the operator
	// must see it before anything else.
	if r := st.LastReload; r != nil {
		at := r.Time.UTC().Format(time.RFC3339)
		if !r.OK {
			fmt.Fprintf(w, "LAST RELOAD FAILED (%s): %s\n", at, safeField(r.Error))
		}
		if len(r.Dropped) > 0 {
			fmt.Fprintf(w, "LAST RELOAD DROPPED %d run-time change(s) (%s): the configuration changed the same setting and wins:\n", len(r.Dropped), at)
			for _, d := range r.Dropped {
				fmt.Fprintf(w, "  %s\n", safeField(d))
			}
		}
		if !r.OK || len(r.Dropped) > 0 {
			fmt.Fprintln(w)
		}
	}
	tw := tabwriter.NewWriter(w, 2, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "POOL\tBACKEND\tPROTO\tADDR\tSTATE\tWEIGHT\tOUTSTANDING\tMOP\tALLOWED/S\tLEARNED/S")
	row := func(pool string, b admin.BackendStatus) {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%d\t%s\t%.1f\t%.1f\n", pool, safeField(b.ID), safeField(b.Protocol), safeField(b.Addr), safeField(b.State), b.Weight, b.Outstanding, safeField(b.MOP.Phase), b.MOP.AllowedRate, b.MOP.LearnedRate)
	}
	if len(st.Pools) == 0 {
		// A sluice without pools in /status: one table as before.
		for _, b := range st.Backends {
			row("-", b)
		}
	}
	byID := map[string]admin.BackendStatus{}
	for _, b := range st.Backends {
		byID[b.Protocol+" "+b.ID] = b
	}
	for _, p := range st.Pools {
		name := safeField(p.Protocol + " " + p.Name)
		if p.Panic {
			name += " (panic)"
		}
		for _, id := range p.Backends {
			if b, ok := byID[p.Protocol+" "+id]; ok {
				row(name, b)
			}
		}
	}
	tw.Flush()
	// Why each backend that is not up is out: the operator, its traffic,
	// its health checks (with the probe's error), a Retry-After.
	first := true
	for _, b := range st.Backends {
		if b.Reason == "" {
			continue
		}
		if first {
			fmt.Fprintln(w)
			first = false
		}
		fmt.Fprintf(w, "%s %s: %s\n", safeField(b.Protocol), safeField(b.ID), safeField(b.Reason))
	}
	// A memory probe that fails leaves MOP at its rate, -mop-initial-rate
	// for a backend that learned nothing: new work over it is refused
	// while the backend is up, and the table alone does not say why.
	for _, b := range st.Backends {
		if !b.MOP.Enabled || b.MOP.ProbeError == "" {
			continue
		}
		if first {
			fmt.Fprintln(w)
			first = false
		}
		fmt.Fprintf(w, "%s %s: memory probe failing (%d failures): %s; MOP holds its allowed rate of %.1f/s until a probe answers (check metrics= and -mop-used-metric/-mop-max-metric)\n",
			safeField(b.Protocol), safeField(b.ID), b.MOP.ProbeFailures, safeField(b.MOP.ProbeError), b.MOP.AllowedRate)
	}
	printRouteTable(w, st.Routes)
	if len(st.ARM) > 0 {
		fmt.Fprintln(w)
		fmt.Fprintln(tw, "ARM RULE\tRATE\tLIMIT\tQUEUED\tADMITTED\tDELAYED\tREFUSED")
		for _, r := range st.ARM {
			fmt.Fprintf(tw, "%s\t%d\t%d/%s\t%d\t%d\t%d\t%d\n", safeField(r.Name), r.Rate, r.Limit, safeField(r.Unit), r.Queued, r.Admitted, r.Delayed, r.Refused)
		}
		tw.Flush()
	}
	return nil
}

// printRoutes prints GET /control/routes.
func printRoutes(w io.Writer, data []byte) error {
	var routes map[string][]admin.RouteStatus
	if err := json.Unmarshal(data, &routes); err != nil {
		return err
	}
	if !printRouteTable(w, routes) {
		fmt.Fprintln(w, "no routes: new work goes to the pool default")
	}
	return nil
}

// printRouteTable prints the routes of both protocols with their index
// (for route remove) and hits; false when there are none.
func printRouteTable(w io.Writer, routes map[string][]admin.RouteStatus) bool {
	n := 0
	for _, rs := range routes {
		n += len(rs)
	}
	if n == 0 {
		return false
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 2, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "ROUTE\tPROTO\tPOOL\tHITS\tSPEC")
	for _, proto := range []string{"http", "sip"} {
		for i, r := range routes[proto] {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%s\n", i, proto, safeField(r.Pool), r.Hits, safeField(r.Spec))
		}
	}
	tw.Flush()
	return true
}
