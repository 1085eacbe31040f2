package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/sluicelb/sluice/demo"
	"github.com/sluicelb/sluice/sip/demoback"
)

func init() {
	register("demo", "run the balancer with two embedded SIP and two HTTP backends that hold real memory per session", runDemo)
}

// demoDefaults come before the user's flags, so any of them can be
// overridden: the listen addresses of the issue, a MOP window as long as a
// demo session lives, and a memory limit so that the node memory states
// are on.
var demoDefaults = []string{
	"-http-listen", "127.0.0.1:8080",
	"-sip-listen", "127.0.0.1:5060",
	"-admin-listen", "127.0.0.1:9090",
	"-mop-window", "30s",
	"-mop-initial-rate", "5",
	"-mem-limit", "512MiB",
}

func runDemo(args []string, stdout, stderr io.Writer) int {
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer cancel()
	return demoMain(ctx, args, stdout, stderr, nil)
}

// demoBackends are the embedded backends of a demo.
type demoBackends struct {
	http []*demo.HTTPBackend
	sip  []*demoback.UAS
}

func (d *demoBackends) close() {
	for _, b := range d.http {
		b.Close()
	}
	for _, u := range d.sip {
		u.Close()
	}
}

// startDemoBackends starts two HTTP and two SIP backends on loopback. Each
// session or dialog holds 64 KiB for up to 30 s against a 64 MiB maximum,
// so a backend fills at about 34 new sessions per second and MOP's 85%
// ceiling sits near 29 per second.
func startDemoBackends(logger *slog.Logger) (*demoBackends, error) {
	d := &demoBackends{}
	for i := 1; i <= 2; i++ {
		b, err := demo.NewHTTPBackend(demo.HTTPBackendConfig{Name: fmt.Sprintf("h%d", i), Logger: logger})
		if err != nil {
			d.close()
			return nil, fmt.Errorf("demo http backend: %w", err)
		}
		d.http = append(d.http, b)
		u, err := demoback.New(demoback.Config{Name: fmt.Sprintf("s%d", i), Logger: logger})
		if err != nil {
			d.close()
			return nil, fmt.Errorf("demo sip backend: %w", err)
		}
		d.sip = append(d.sip, u)
	}
	return d, nil
}

// args are the run flags that put the demo backends behind the balancer.
func (d *demoBackends) args() []string {
	var a []string
	for _, b := range d.http {
		a = append(a, "-http-backend", fmt.Sprintf("%s,metrics=%s,id=%s", b.Addr(), b.MetricsURL(), b.Name()))
	}
	for _, u := range d.sip {
		a = append(a, "-sip-backend", fmt.Sprintf("%s,metrics=%s,id=%s", u.Addr(), u.MetricsURL(), u.Name()))
	}
	return a
}

func demoMain(ctx context.Context, userArgs []string, stdout, stderr io.Writer, hooks *runHooks) int {
	for _, a := range userArgs {
		if a == "-h" || a == "-help" || a == "--help" {
			fmt.Fprintln(stdout, "usage: sluice demo [run flags]\n\nStarts two HTTP and two SIP demo backends on loopback and `sluice run` in front of them.\nEvery run flag may be given; see 'sluice run -help'. Defaults: "+strings.Join(demoDefaults, " "))
			return 0
		}
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	backends, err := startDemoBackends(logger)
	if err != nil {
		fmt.Fprintln(stderr, "sluice demo:", err)
		return 1
	}
	defer backends.close()
	args := append(append(append([]string{}, demoDefaults...), backends.args()...), userArgs...)
	sipAddr := flagValue(args, "sip-listen")
	ready := func(httpAddr, adminAddr net.Addr) {
		printDemoHelp(stdout, backends, httpAddr, adminAddr, sipAddr)
		if hooks != nil && hooks.ready != nil {
			hooks.ready(httpAddr, adminAddr)
		}
	}
	return run(ctx, args, stdout, stderr, &runHooks{ready: ready})
}

// flagValue is the last value given to -name in args.
func flagValue(args []string, name string) string {
	v := ""
	for i, a := range args {
		a = strings.TrimLeft(a, "-")
		if a == name && i+1 < len(args) {
			v = args[i+1]
		} else if rest, ok := strings.CutPrefix(a, name+"="); ok {
			v = rest
		}
	}
	return v
}

func printDemoHelp(w io.Writer, d *demoBackends, httpAddr, adminAddr net.Addr, sipAddr string) {
	fmt.Fprintln(w, "sluice demo is up.")
	fmt.Fprintln(w)
	if httpAddr != nil {
		fmt.Fprintf(w, "  HTTP   http://%s   -> %s, %s\n", httpAddr, d.http[0].Addr(), d.http[1].Addr())
	}
	fmt.Fprintf(w, "  SIP    udp/tcp %s  -> %s, %s\n", sipAddr, d.sip[0].Addr(), d.sip[1].Addr())
	if adminAddr != nil {
		fmt.Fprintf(w, "  admin  http://%s   (/status /metrics /events /healthz)\n", adminAddr)
	}
	fmt.Fprintln(w, "\nEach new session holds 64 KiB in its backend for 30 s (64 MiB max): MOP learns about 29 new sessions/s per backend.")
	fmt.Fprintln(w, "\nTry:")
	if httpAddr != nil {
		fmt.Fprintf(w, "  curl -si -c /tmp/sluice.jar -b /tmp/sluice.jar http://%s/          # a sticky session\n", httpAddr)
		fmt.Fprintf(w, "  wrk -t2 -c20 -d60s http://%s/                                   # every request new work: watch MOP refuse\n", httpAddr)
	}
	fmt.Fprintf(w, "  sipp -sn uac -r 40 -d 10000 -m 4000 %s                          # calls of 10 s; BYEs always pass\n", sipAddr)
	if adminAddr != nil {
		fmt.Fprintf(w, "  watch -n1 'curl -s http://%s/status'\n", adminAddr)
		fmt.Fprintf(w, "  curl -s 'http://%s/events?limit=20'\n", adminAddr)
	}
	fmt.Fprintf(w, "\nStop with Ctrl-C (drains for up to -drain-timeout). Started %s.\n", time.Now().Format(time.RFC3339))
}
