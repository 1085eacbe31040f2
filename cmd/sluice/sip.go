package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sluicelb/sluice/admission"
	"github.com/sluicelb/sluice/lb"
	lbsip "github.com/sluicelb/sluice/sip"
)

// sipOptions holds the -sip-* flags.
type sipOptions struct {
	cfg      lbsip.Config
	backends []string
}

// envName is the environment twin of a flag: -sip-listen → SLUICE_SIP_LISTEN.
func envName(flagName string) string {
	return "SLUICE_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// envDefault returns the flag's environment twin if set, else def.
func envDefault(name, def string) string {
	if v, ok := os.LookupEnv(envName(name)); ok {
		return v
	}
	return def
}

func envDuration(name string, def time.Duration) time.Duration {
	if v, ok := os.LookupEnv(envName(name)); ok {
		if d, err := time.ParseDuration(v); err == nil {
			return d
		}
	}
	return def
}

func envInt(name string, def int) int {
	if v, ok := os.LookupEnv(envName(name)); ok {
		if n, err := strconv.Atoi(v); err == nil {
			return n
		}
	}
	return def
}

// addSIPFlags registers the SIP front end's flags on fs. Each takes its
// default from its SLUICE_* environment twin; -sip-backend's twin
// SLUICE_SIP_BACKEND holds several values separated by spaces.
func addSIPFlags(fs *flag.FlagSet) *sipOptions {
	o := &sipOptions{}
	c := &o.cfg
	fs.StringVar(&c.Listen, "sip-listen", envDefault("sip-listen", ""), "SIP listen address for UDP and TCP (default :5060 when a -sip-backend is given)")
	fs.StringVar(&c.Advertise, "sip-advertise", envDefault("sip-advertise", ""), "host:port written into Via and Record-Route (default: the listen address)")
	if v := os.Getenv(envName("sip-backend")); v != "" {
		o.backends = strings.Fields(v)
	}
	fs.Func("sip-backend", "SIP backend `ADDR[,transport=udp|tcp][,weight=N][,metrics=URL][,id=NAME]` (repeatable)", func(s string) error {
		if _, err := lbsip.ParseBackend(s); err != nil {
			return err
		}
		o.backends = append(o.backends, s)
		return nil
	})
	fs.StringVar(&c.Policy, "sip-lb-policy", envDefault("sip-lb-policy", "hash"), "selection of new work: hash (consistent hash on Call-ID), round-robin, weighted-round-robin, least-outstanding, p2c")
	fs.DurationVar(&c.TokenTTL, "sip-affinity-ttl", envDuration("sip-affinity-ttl", 24*time.Hour), "lifetime of the signed backend token in Record-Route (longest dialog)")
	fs.DurationVar(&c.DialogTTL, "sip-dialog-ttl", envDuration("sip-dialog-ttl", lbsip.DefaultDialogTTL), "dialog table: forget a dialog after this long without an in-dialog request (a bit more than the longest call)")
	fs.IntVar(&c.DialogMax, "sip-dialog-max", envInt("sip-dialog-max", lbsip.DefaultDialogMax), "dialog table: most dialogs recorded (64 bytes each at most); when full, new dialogs' requests without our Route go by Call-ID hash")
	fs.DurationVar(&c.FailoverTimeout, "sip-failover-timeout", envDuration("sip-failover-timeout", 2*time.Second), "silence before new work moves to the next backend")
	fs.DurationVar(&c.DrainDefault, "sip-drain-default", envDuration("sip-drain-default", 5*time.Second), "no new work to a backend that answered 503 without Retry-After for this long")
	fs.DurationVar(&c.HealthInterval, "sip-health-interval", envDuration("sip-health-interval", 5*time.Second), "OPTIONS ping period per backend (0 disables)")
	fs.DurationVar(&c.HealthTimeout, "sip-health-timeout", envDuration("sip-health-timeout", 2*time.Second), "wait for an OPTIONS answer")
	fs.IntVar(&c.HealthRise, "sip-health-rise", envInt("sip-health-rise", 2), "answered pings in a row that bring a backend up")
	fs.IntVar(&c.HealthFall, "sip-health-fall", envInt("sip-health-fall", 3), "unanswered pings in a row that take a backend down")
	fs.DurationVar(&c.TCPIdleTimeout, "sip-tcp-idle-timeout", envDuration("sip-tcp-idle-timeout", 5*time.Minute), "close TCP connections idle this long")
	fs.DurationVar(&c.TCPMessageTimeout, "sip-tcp-message-timeout", envDuration("sip-tcp-message-timeout", 10*time.Second), "close a TCP connection whose message is not complete this long after its first byte (not restarted per byte)")
	fs.IntVar(&c.TCPMaxConns, "sip-tcp-max-conns", envInt("sip-tcp-max-conns", 10000), "most TCP connections")
	fs.IntVar(&c.UDPBuffer, "sip-udp-buffer", envInt("sip-udp-buffer", 4<<20), "UDP socket buffer in bytes")
	fs.IntVar(&c.MaxMessage, "sip-max-message", envInt("sip-max-message", 65535), "largest SIP message in bytes")
	return o
}

// enabled reports whether the SIP front end is configured.
func (o *sipOptions) enabled() bool { return len(o.backends) > 0 }

// config returns the Config with the parsed backends.
func (o *sipOptions) config() (lbsip.Config, error) {
	c := o.cfg
	c.Backends = nil
	for _, s := range o.backends {
		b, err := lbsip.ParseBackend(s)
		if err != nil {
			return c, err
		}
		c.Backends = append(c.Backends, b)
	}
	return c, nil
}

// startSIP builds and starts the SIP front end. mops may be nil (no MOP);
// it is called once per backend. The server stops when ctx is done or
// Close is called. It returns nil, nil when no -sip-backend is given.
func startSIP(ctx context.Context, o *sipOptions, adm *admission.Controller, signer lbsip.Signer,
	mops func(lbsip.BackendConfig) *admission.MOP, logger *slog.Logger) (*lbsip.Server, error) {
	if !o.enabled() {
		return nil, nil
	}
	cfg, err := o.config()
	if err != nil {
		return nil, err
	}
	srv, err := lbsip.New(cfg, lbsip.Deps{Admission: adm, Signer: signer, MOP: mops}, logger)
	if err != nil {
		return nil, err
	}
	if err := srv.Start(ctx); err != nil {
		return nil, err
	}
	return srv, nil
}

func init() {
	register("sip", "run the SIP front end alone (for SIP-only deployments and benchmarks)", runSIP)
}

// runSIP is the sip command: the SIP front end with its own admission
// controller, until SIGINT or SIGTERM.
func runSIP(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("sip", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := addSIPFlags(fs)
	var rules []admission.RuleConfig
	if v := os.Getenv(envName("arm")); v != "" {
		for _, s := range strings.Fields(v) {
			rc, err := admission.ParseRule(s)
			if err != nil {
				fmt.Fprintln(stderr, "sluice sip:", err)
				return 2
			}
			rules = append(rules, rc)
		}
	}
	fs.Func("arm", "ARM rule, e.g. `name=inv,proto=sip,method=INVITE,limit=300/s,action=reject` (repeatable)", func(s string) error {
		rc, err := admission.ParseRule(s)
		if err != nil {
			return err
		}
		rules = append(rules, rc)
		return nil
	})
	keyFile := fs.String("affinity-key-file", envDefault("affinity-key-file", "sluice-affinity.key"), "key, or key ring of \"ID HEXKEY\" lines (newest last), of affinity tokens (created when missing)")
	logLevel := fs.String("log-level", envDefault("log-level", "info"), "debug, info, warn or error")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile to this file (for benchmarks)")
	drain := fs.Duration("drain-timeout", envDuration("drain-timeout", 0), "on SIGTERM, refuse new work and keep dialogs flowing this long before exiting")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(*logLevel)); err != nil {
		fmt.Fprintln(stderr, "sluice sip: -log-level:", err)
		return 2
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: lvl}))
	if !o.enabled() {
		fmt.Fprintln(stderr, "sluice sip: at least one -sip-backend is required")
		return 2
	}
	if o.cfg.Listen == "" {
		o.cfg.Listen = ":5060"
	}
	ring, err := lb.LoadOrCreateKeyRing(*keyFile)
	if err != nil {
		fmt.Fprintln(stderr, "sluice sip: -affinity-key-file:", err)
		return 1
	}
	signer, err := lb.NewRingSigner(ring)
	if err != nil {
		fmt.Fprintln(stderr, "sluice sip:", err)
		return 1
	}
	clock := admission.MonoClock{}
	adm, err := admission.NewController(admission.ControllerConfig{Rules: rules}, nil, clock.Now())
	if err != nil {
		fmt.Fprintln(stderr, "sluice sip:", err)
		return 2
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			fmt.Fprintln(stderr, "sluice sip:", err)
			return 1
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(stderr, "sluice sip:", err)
			return 1
		}
		defer func() {
			pprof.StopCPUProfile()
			f.Close()
		}()
	}
	sig, cancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer cancel()
	// The server runs until after the drain, not until the signal.
	run, stop := context.WithCancel(context.Background())
	defer stop()
	go adm.Run(run, clock, 10*time.Millisecond)
	srv, err := startSIP(run, o, adm, signer, nil, logger)
	if err != nil {
		fmt.Fprintln(stderr, "sluice sip:", err)
		return 1
	}
	<-sig.Done()
	if *drain > 0 {
		srv.Drain()
		time.Sleep(*drain)
	}
	srv.Close()
	m := srv.Metrics()
	fmt.Fprintf(stdout, "sip: requests=%d responses=%d forwarded=%d relayed=%d refused=%d failovers=%d malformed=%d\n",
		m.Requests.Load(), m.Responses.Load(), m.Forwarded.Load(), m.Relayed.Load(), m.Refused.Load(), m.Failovers.Load(), m.Malformed.Load())
	return 0
}
