package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluicelb/sluice/admission"
	"github.com/sluicelb/sluice/node"
	"github.com/sluicelb/sluice/tlsedge"
)

// lookupIn is an environment made of m, for parseFlags.
func lookupIn(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func writeFile(t *testing.T, body string) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "sluice.conf")
	if err := os.WriteFile(f, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// TestFlagSources: the command line wins over the environment, the
// environment over the config file; a repeatable flag takes all its values
// from the first source that has it.
func TestFlagSources(t *testing.T) {
	conf := writeFile(t, `# sluice settings
http-listen 127.0.0.1:1111
-lb-policy p2c
mop-window 90s
arm name=a,limit=1/s
arm name=b,limit=2/s
admin-listen
sip-backend 10.0.0.9:5060,id=f

http-backend 10.0.0.1:80,id=file
`)
	fs := newFlagSet("run", io.Discard)
	o := newRunFlags(fs)
	env := map[string]string{
		"SLUICE_CONFIG":       conf,
		"SLUICE_LB_POLICY":    "least-outstanding",
		"SLUICE_HTTP_BACKEND": "10.0.0.2:80,id=e1 10.0.0.3:80,id=e2",
		"SLUICE_MOP_WINDOW":   "30s",
	}
	args := []string{"-mop-window", "45s", "-http-sticky-ttl", "2h"}
	if err := parseFlags(fs, args, lookupIn(env)); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ name, got, want string }{
		{"http-listen (file)", o.http.Listen, "127.0.0.1:1111"},
		{"lb-policy (env over file)", o.pool.Policy, "least-outstanding"},
		{"mop-window (command line over env and file)", o.mop.Window.String(), "45s"},
		{"http-sticky-ttl (command line)", o.http.StickyTTL.String(), "2h0m0s"},
		{"arm (file, repeated)", strings.Join(o.arm.values, " "), "name=a,limit=1/s name=b,limit=2/s"},
		{"http-backend (env over file)", strings.Join(o.httpBackends.values, " "), "10.0.0.2:80,id=e1 10.0.0.3:80,id=e2"},
		{"admin-listen (file, empty)", o.adminListen, ""},
		{"sip-backend (file)", strings.Join(o.sip.backends.values, " "), "10.0.0.9:5060,id=f"},
		{"http-stream-threshold (default)", fmt.Sprint(o.http.StreamThreshold), "1048576"},
	} {
		if c.got != c.want {
			t.Errorf("%s = %q, want %q", c.name, c.got, c.want)
		}
	}
}

// TestConfigFileErrors: a bad line stops parsing, naming the file, the
// line and the flag.
func TestConfigFileErrors(t *testing.T) {
	for _, tc := range []struct{ body, want string }{
		{"http-listen :1\nfrobnicate 3\n", `:2: unknown flag "frobnicate"`},
		{"# ok\n\nmop-window soon\n", ":3: -mop-window: "},
		{"arm name=x\n", ":1: -arm: "},
		{"config other.conf\n", ":1: a config file cannot name another"},
	} {
		f := writeFile(t, tc.body)
		fs := newFlagSet("run", io.Discard)
		newRunFlags(fs)
		err := parseFlags(fs, []string{"-config", f}, lookupIn(nil))
		if err == nil || !strings.Contains(err.Error(), "-config "+f+tc.want) {
			t.Errorf("%q: err %v, want one with %q", tc.body, err, "-config "+f+tc.want)
		}
	}
	fs := newFlagSet("run", io.Discard)
	newRunFlags(fs)
	if err := parseFlags(fs, []string{"-config", filepath.Join(t.TempDir(), "missing")}, lookupIn(nil)); err == nil || !strings.Contains(err.Error(), "-config") {
		t.Errorf("missing config file: err %v", err)
	}
}

// badValues are values each flag that takes free text refuses; flags of
// typed values (numbers, durations, sizes, shares, booleans) get "bogus".
var badValues = map[string]string{
	"http-backend":           "nohost",
	"sip-backend":            "10.0.0.1:5060,transport=sctp",
	"http-trusted-proxy":     "10.0.0.0/99",
	"dns-server":             "10.0.0.1:99999",
	"proxy-protocol-from":    "lb.example",
	"arm":                    "name=x",
	"http-listen":            "127.0.0.1:99999",
	"http-h2c-listen":        "127.0.0.1:99999",
	"https-listen":           "127.0.0.1:99999",
	"sip-listen":             "127.0.0.1:99999",
	"sip-tls-listen":         "127.0.0.1:99999",
	"sip-ws-listen":          "127.0.0.1:99999",
	"sip-wss-listen":         "127.0.0.1:99999",
	"sip-ws-path":            "sip",
	"sip-tls-advertise":      "no port",
	"sip-ws-advertise":       "no port",
	"sip-wss-advertise":      "no port",
	"sip-ws-origin":          "phone.example.com",
	"admin-listen":           "127.0.0.1:99999",
	"admin-host":             "http://evil.example/",
	"http-sticky-cookie":     "a b",
	"health-path":            "healthz",
	"http-sticky-app-cookie": "a;b",
	"http-hash-key":          "body",
	"http-engine":            "threads",
	"http-upgrade":           "h2c",
	"lb-policy":              "fastest",
	"sip-lb-policy":          "fastest",
	"sip-unknown-dialog":     "maybe",
	"health-panic":           "0",
	"sip-advertise":          "no port",
	"mop-used-metric":        "a{",
	"mop-max-metric":         "a{",
	"log-level":              "loud",
	"affinity-key-file":      "/proc/no/such/dir/key",
	"backends-file":          "/proc/no/such/file",
	"arm-file":               "/proc/no/such/file",
	"admin-token-file":       "/proc/no/such/file",
	"cluster-redis":          "http://127.0.0.1:6379",
	"cluster-name":           "a{b}",
	"cluster-node":           "a b",
	"cluster-fail":           "shut",
	"data-dir":               "/proc/no/such/dir",
	"tls-cert":               "site.pem,chain=ca.pem",
	"cpuprofile":             "/proc/no/such/dir/cpu.prof",
	"config":                 "/proc/no/such/file",
	"since":                  "yesterday",
	"limit":                  "ten/min",
	"arrivals":               "1,x",
	"action":                 "explode",
	"mop":                    "base=lots",
	"http-pool":              "name=api,colour=red",
	"sip-pool":               "name=london,hash-key=source",
	"http-route":             "pool=api,path=~(",
	"sip-route":              "pool=",
	"access-log":             "syslog://no-port",
	"http-access-log":        "/proc/no/such/dir/access.log",
	"sip-access-log":         "syslog+tcp://",
	"access-log-format":      "xml",
	"access-log-sample":      "new=2",
	"otlp-endpoint":          "grpc://collector:4317",
	"dns-family":             "inet4",
}

// freeForm are flags whose every value is acceptable, with the reason.
var freeForm = map[string]string{
	"events admin-listen": "an address read only while the store is in use; a bad one is reported as not answering",
	"events admin":        "the same address as --admin-listen, spelt as sluice ctl spells it",
	"events type":         "a filter: any kind may be asked for, an unknown one matches nothing",
	"events subject":      "a filter: any subject may be asked for, an unknown one matches nothing",
}

// commandArgs are arguments under which each command starts; the flag
// under test is left out of them.
func commandArgs(cmd, dir string) [][2]string {
	switch cmd {
	case "run", "demo", "sip":
		return [][2]string{{"data-dir", dir}, {"http-listen", "127.0.0.1:0"}, {"admin-listen", ""}, {"sip-listen", "127.0.0.1:0"},
			{"http-backend", "127.0.0.1:1,metrics=http://127.0.0.1:1/m"}, {"sip-backend", "127.0.0.1:1"},
			{"health-interval", "0"}, {"sip-health-interval", "0"}}
	case "events":
		return [][2]string{{"data-dir", dir}}
	case "simulate":
		return [][2]string{{"limit", "10/min"}, {"arrivals", "1,2"}}
	}
	return nil
}

// TestEveryFlagRejectsBadValue walks every flag of every command that has
// flags: a bad value in its SLUICE_* twin stops the command with an error
// naming the flag or the variable, and nothing is served.
func TestEveryFlagRejectsBadValue(t *testing.T) {
	sets := map[string]*flag.FlagSet{}
	flagSetMade = func(cmd string, fs *flag.FlagSet) { sets[cmd] = fs }
	for name, c := range commands {
		if name != "demo" { // demo is run with demo backends: the same flags
			c.run([]string{"-help"}, io.Discard, io.Discard)
		}
	}
	flagSetMade = nil
	cmds := make([]string, 0, len(sets))
	for c := range sets {
		cmds = append(cmds, c)
	}
	sort.Strings(cmds)
	if !slices.Contains(cmds, "run") || !slices.Contains(cmds, "sip") {
		t.Fatalf("commands walked: %v", cmds)
	}
	for _, cmd := range cmds {
		sets[cmd].VisitAll(func(f *flag.Flag) {
			t.Run(cmd+"/"+f.Name, func(t *testing.T) {
				if why, ok := freeForm[cmd+" "+f.Name]; ok {
					t.Skip(why)
				}
				bad := "bogus"
				switch fmt.Sprintf("%T", f.Value) {
				case "*flag.stringValue", "*main.listFlag", "flag.funcValue":
					var ok bool
					if bad, ok = badValues[f.Name]; !ok {
						t.Fatalf("-%s of %s takes free text: add a bad value to badValues or a reason to freeForm", f.Name, cmd)
					}
				}
				env := envName(f.Name)
				t.Setenv(env, bad)
				var args []string
				for _, a := range commandArgs(cmd, t.TempDir()) {
					if a[0] != f.Name {
						args = append(args, "-"+a[0], a[1])
					}
				}
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
				defer cancel()
				var stderr syncBuffer
				var code int
				switch cmd {
				case "run":
					code = run(ctx, args, io.Discard, &stderr, nil)
				case "sip":
					code = serve(ctx, sipPreset, args, io.Discard, &stderr, nil)
				default:
					code = commands[cmd].run(args, io.Discard, &stderr)
				}
				out := stderr.String()
				if code == 0 || !(strings.Contains(out, "-"+f.Name) || strings.Contains(out, env)) {
					t.Errorf("%s=%q: exit %d, stderr %q; want a failure naming -%s or %s", env, bad, code, out, f.Name, env)
				}
			})
		})
	}
}

// TestFieldFlags: every field of the front ends' Configs that a flag sets
// is mapped to that flag, and every mapped flag exists, so that an error
// about a field reaches the operator under the flag's name.
func TestFieldFlags(t *testing.T) {
	fs := newFlagSet("run", io.Discard)
	newRunFlags(fs)
	notFlags := map[string]bool{ // set by the wiring, not by a flag of their own
		"http.RetryAfterNoBackend": true, "http.Clock": true, "http.Now": true, "http.ObserveForward": true,
		"http.TLSConfig": true, "http.Handshakes": true, // from the certificate store
		"sip.TLSConfig": true, "sip.Handshakes": true,
	}
	fields := fieldFlags()
	for pkg, typ := range map[string]reflect.Type{"http": reflect.TypeOf(node.HTTPConfig{}), "sip": reflect.TypeOf(node.SIPConfig{}), "tlsedge": reflect.TypeOf(tlsedge.Config{})} {
		for i := range typ.NumField() {
			key := pkg + "." + typ.Field(i).Name
			if notFlags[key] {
				continue
			}
			name, ok := fields[key]
			if !ok {
				t.Errorf("%s has no flag in fieldFlags", key)
			} else if fs.Lookup(name) == nil {
				t.Errorf("%s maps to -%s, which sluice run does not have", key, name)
			}
		}
	}
	for key, name := range fields {
		if fs.Lookup(name) == nil {
			t.Errorf("%s maps to -%s, which sluice run does not have", key, name)
		}
	}
	for _, tc := range []struct {
		err  error
		want string
	}{
		{fmt.Errorf("build: %w", admission.NewFieldError("sip", "TokenTTL", "must be at least 1m")), "-sip-affinity-ttl: build: must be at least 1m"},
		// The library's field names in the message become flags.
		{admission.NewFieldError("sip", "TCPPartialBudget", "must be at least twice MaxMessage + 1 (131072 bytes)"), "-sip-tcp-partial-budget: must be at least twice -sip-max-message + 1 (131072 bytes)"},
		{admission.NewFieldError("lb", "HealthConfig.Rise", "must be >= 1 (got 0)"), "-health-rise: must be >= 1 (got 0)"},
		{&admission.FieldError{Field: "MemoryConfig.Low", Err: errors.New("must satisfy 0 < Low < Lower")}, "-mem-low: must satisfy 0 < -mem-low < -mem-lower"},
		{admission.NewFieldError("http", "NoSuchField", "odd"), "http: NoSuchField: odd"},
	} {
		err := flagError(tc.err)
		if got := err.Error(); got != tc.want {
			t.Errorf("flagError(%q) = %q, want %q", tc.err, got, tc.want)
		}
		if !errors.As(err, new(*admission.FieldError)) {
			t.Errorf("flagError(%q) no longer wraps the library's error", tc.err)
		}
	}
}

// TestEveryFieldErrorHasFlag reads the sources of the packages whose
// Configs the flags fill and collects every field a FieldError can name
// (fieldError, fieldErr and NewFieldError calls, FieldError literals), and
// those node's own checks return: each must map to a flag of `sluice run`,
// so that no validation error reaches the operator in the library's words.
func TestEveryFieldErrorHasFlag(t *testing.T) {
	fields := fieldFlags()
	found := 0
	for _, pkg := range []string{"admission", "lb", "http", "sip", "cluster", "node", "tlsedge"} {
		for _, key := range fieldErrorKeys(t, pkg) {
			found++
			if _, ok := fields[key]; !ok {
				t.Errorf("a FieldError of %s names no flag: add a section field (registry.go) for it", key)
			}
		}
	}
	if found < 40 {
		t.Fatalf("only %d FieldError fields found in the sources: the walk misses them", found)
	}
}

// fieldErrorKeys parses the non-test Go files of ../../pkg and returns
// every "pkg.Field" its FieldErrors name with a constant field.
func fieldErrorKeys(t *testing.T, pkg string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("..", "..", pkg, "*.go"))
	if err != nil || len(files) == 0 {
		t.Fatalf("%s: no sources (%v)", pkg, err)
	}
	lit := func(e ast.Expr) (string, bool) {
		b, ok := e.(*ast.BasicLit)
		if !ok || b.Kind != token.STRING {
			return "", false
		}
		s, err := strconv.Unquote(b.Value)
		return s, err == nil
	}
	var keys []string
	fset := token.NewFileSet()
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(file, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.CallExpr:
				var name string
				switch fn := n.Fun.(type) {
				case *ast.Ident:
					name = fn.Name
				case *ast.SelectorExpr:
					name = fn.Sel.Name
				}
				switch {
				case (name == "fieldError" || name == "fieldErr") && len(n.Args) > 0:
					if field, ok := lit(n.Args[0]); ok {
						keys = append(keys, pkg+"."+field)
					}
				case name == "NewFieldError" && len(n.Args) > 1:
					p, ok1 := lit(n.Args[0])
					field, ok2 := lit(n.Args[1])
					if ok1 && ok2 {
						keys = append(keys, p+"."+field)
					}
				}
			case *ast.CompositeLit:
				if id, ok := n.Type.(*ast.Ident); !ok || id.Name != "FieldError" {
					return true
				}
				p, field := pkg, ""
				for _, e := range n.Elts {
					kv, ok := e.(*ast.KeyValueExpr)
					if !ok {
						continue
					}
					k, _ := kv.Key.(*ast.Ident)
					if v, ok := lit(kv.Value); ok && k != nil && k.Name == "Field" {
						field = v
					} else if ok && k != nil && k.Name == "Pkg" && v != "" {
						p = v
					}
				}
				if field != "" {
					keys = append(keys, p+"."+field)
				}
			}
			return true
		})
	}
	return keys
}

// TestConfigFileBounded: -config (and ctl's -token-file) read only a
// regular file of at most 4 MiB: a FIFO, /dev/zero or a huge file stop
// the command at once with an error naming the flag, instead of hanging
// or growing without bound.
func TestConfigFileBounded(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	big := filepath.Join(dir, "big.conf")
	os.WriteFile(big, []byte(strings.Repeat("# padding\n", 4<<20/10+1)), 0o600)
	within := func(what string, f func() error) error {
		t.Helper()
		done := make(chan error, 1)
		go func() { done <- f() }()
		select {
		case err := <-done:
			return err
		case <-time.After(30 * time.Second):
			t.Fatalf("%s does not return", what)
		}
		return nil
	}
	// /dev/zero last: without the bound it would eat memory.
	for _, c := range []struct{ path, want string }{
		{big, "more than 4 MiB"},
		{fifo, "not a regular file (a named pipe)"},
		{"/dev/zero", "not a regular file (a character device)"},
	} {
		err := within("-config "+c.path, func() error {
			fs := newFlagSet("run", io.Discard)
			newRunFlags(fs)
			return parseFlags(fs, []string{"-config", c.path}, lookupIn(nil))
		})
		if err == nil || !strings.HasPrefix(err.Error(), "-config: ") || !strings.Contains(err.Error(), c.want) {
			t.Errorf("-config %s: %v, want an error naming -config with %q", c.path, err, c.want)
		}
		err = within("ctl -token-file "+c.path, func() error { _, err := readCtlToken(c.path); return err })
		if err == nil || !strings.HasPrefix(err.Error(), "-token-file: ") || !strings.Contains(err.Error(), c.want) {
			t.Errorf("ctl -token-file %s: %v, want an error naming -token-file with %q", c.path, err, c.want)
		}
	}
}

// TestZeroRefusedByFlag: a zero the libraries would silently read as
// their default is refused at start-up under the flag's name (node's
// checks return the libraries' FieldErrors, named through the registry).
func TestZeroRefusedByFlag(t *testing.T) {
	for _, tc := range []struct{ flag, value, want string }{
		{"health-rise", "0", "sluice run: -health-rise: must be positive"},
		{"mop-window", "0s", "sluice run: -mop-window: must be positive"},
		{"mop-probe-interval", "0s", "sluice run: -mop-probe-interval: must be positive"},
		{"http-sticky-ttl", "0s", "sluice run: -http-sticky-ttl: must be positive"},
		{"health-max-fails", "-1", "sluice run: -health-max-fails: must not be negative (0 disables passive ejection)"},
		{"drain-timeout", "-1s", "sluice run: -drain-timeout must not be negative (0: no shutdown drain)"},
	} {
		t.Run(tc.flag, func(t *testing.T) {
			var stderr strings.Builder
			args := []string{"-data-dir", t.TempDir(), "-admin-listen", "", "-http-listen", "127.0.0.1:0", "-http-backend", "127.0.0.1:1",
				"-health-interval", "0", "-" + tc.flag, tc.value}
			code := run(context.Background(), args, io.Discard, &stderr, nil)
			if code != 2 || strings.TrimSpace(stderr.String()) != tc.want {
				t.Errorf("exit %d, stderr %q; want 2 and %q", code, stderr.String(), tc.want)
			}
		})
	}
}
