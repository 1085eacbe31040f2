package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/sluicelb/sluice/admin"
	"github.com/sluicelb/sluice/internal/opfile"
	"github.com/sluicelb/sluice/node"
)

func init() {
	register("demo", "run the balancer with two embedded SIP and two HTTP backends that hold real memory per session", runDemo)
}

// demoDefaults come before the user's flags, so any of them can be
// overridden: the listen addresses of the issue, a MOP window as long as a
// demo session lives, a first MOP rate that carries the commands the
// banner prints from a cold start (below the HTTP backends' safe 29/s),
// and a memory limit so that the node memory states are on.
var demoDefaults = []string{
	"-http-listen", "127.0.0.1:8080",
	"-sip-listen", "127.0.0.1:5060",
	"-admin-listen", admin.DefaultListen,
	"-mop-window", "30s",
	"-mop-initial-rate", "20",
	"-mem-limit", "512MiB",
}

func runDemo(args []string, stdout, stderr io.Writer) int {
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer cancel()
	return demoMain(ctx, args, stdout, stderr, nil)
}

func demoMain(ctx context.Context, userArgs []string, stdout, stderr io.Writer, hooks *runHooks) int {
	for _, a := range userArgs {
		if a == "-h" || a == "-help" || a == "--help" {
			fmt.Fprintln(stdout, "usage: sluice demo [run flags]\n\nStarts two HTTP and two SIP demo backends on loopback and `sluice run` in front of them.\nEvery run flag may be given; see 'sluice run -help'. Defaults: "+strings.Join(demoDefaults, " "))
			return 0
		}
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	backends, err := node.StartDemo(logger)
	if err != nil {
		fmt.Fprintln(stderr, "sluice demo:", err)
		return 1
	}
	defer backends.Close()
	args := append(append(demoDefaultsFor(userArgs, os.LookupEnv), backends.Args()...), userArgs...)
	sipAddr := flagValue(args, "sip-listen")
	addrs := func(a node.Addrs) {
		if a.SIP != nil {
			sipAddr = a.SIP.String() // the bound port when -sip-listen asked for port 0
		}
	}
	ready := func(httpAddr, adminAddr net.Addr) {
		backends.PrintHelp(stdout, httpAddr, adminAddr, sipAddr)
		if hooks != nil && hooks.ready != nil {
			hooks.ready(httpAddr, adminAddr)
		}
	}
	return run(ctx, args, stdout, stderr, &runHooks{ready: ready, addrs: addrs})
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

// demoDefaultsFor returns the demo's defaults that the user did not set:
// a default given as a flag would win over the user's SLUICE_* variable
// and -config file, which come after the command line.
func demoDefaultsFor(userArgs []string, lookupEnv func(string) (string, bool)) []string {
	set := map[string]bool{}
	for _, a := range userArgs {
		if name, ok := strings.CutPrefix(a, "-"); ok {
			name = strings.TrimPrefix(name, "-")
			name, _, _ = strings.Cut(name, "=")
			set[name] = true
		}
	}
	cfgFile := flagValue(userArgs, configFlag)
	if v, ok := lookupEnv(envName(configFlag)); ok && cfgFile == "" {
		cfgFile = v
	}
	if cfgFile != "" {
		if data, err := opfile.Read(cfgFile, opfile.MaxSize); err == nil { // a bad file is reported by run
			for _, line := range strings.Split(string(data), "\n") {
				if f := strings.Fields(line); len(f) > 0 && !strings.HasPrefix(f[0], "#") {
					set[strings.TrimLeft(f[0], "-")] = true
				}
			}
		}
	}
	var out []string
	for i := 0; i+1 < len(demoDefaults); i += 2 {
		name := strings.TrimPrefix(demoDefaults[i], "-")
		if _, inEnv := lookupEnv(envName(name)); set[name] || inEnv {
			continue
		}
		out = append(out, demoDefaults[i], demoDefaults[i+1])
	}
	return out
}
