package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/pprof"
	"syscall"
	"time"

	"github.com/sluicelb/sluice/admission"
	"github.com/sluicelb/sluice/lb"
	lbsip "github.com/sluicelb/sluice/sip"
)

// sipOptions holds the -sip-* flags.
type sipOptions struct {
	cfg      lbsip.Config
	backends listFlag
}

// addSIPFlags registers the SIP front end's flags on fs, with the defaults
// of lbsip.DefaultConfig.
func addSIPFlags(fs *flag.FlagSet) *sipOptions {
	o := &sipOptions{}
	c := &o.cfg
	d := lbsip.DefaultConfig()
	fs.StringVar(&c.Listen, "sip-listen", d.Listen, "SIP listen address for UDP and TCP (used when a -sip-backend is given)")
	fs.StringVar(&c.Advertise, "sip-advertise", d.Advertise, "host:port written into Via and Record-Route (default: the listen address)")
	o.backends.check = func(s string) error { _, err := lbsip.ParseBackend(s); return err }
	fs.Var(&o.backends, "sip-backend", "SIP `backend` ADDR[,transport=udp|tcp][,weight=N][,metrics=URL][,id=NAME] (repeatable)")
	fs.StringVar(&c.Policy, "sip-lb-policy", d.Policy, "selection of new work: hash (consistent hash on Call-ID), round-robin, weighted-round-robin, least-outstanding, p2c")
	fs.DurationVar(&c.TokenTTL, "sip-affinity-ttl", d.TokenTTL, "lifetime of the signed backend token in Record-Route (longest dialog)")
	fs.DurationVar(&c.DialogTTL, "sip-dialog-ttl", d.DialogTTL, "dialog table: forget a dialog after this long without an in-dialog request (a bit more than the longest call)")
	fs.IntVar(&c.DialogMax, "sip-dialog-max", d.DialogMax, "dialog table: most dialogs recorded (64 bytes each at most); when full, new dialogs' requests without our Route go by Call-ID hash")
	fs.StringVar(&c.UnknownDialog, "sip-unknown-dialog", d.UnknownDialog, "a request with a To-tag, no token of ours and no dialog in the table: new-work (routed by Call-ID hash, admitted like new work), reject (481) or hash (routed by Call-ID hash past every guard)")
	fs.IntVar(&c.UnknownDialogSourceRate, "sip-unknown-dialog-source-rate", d.UnknownDialogSourceRate, "requests of unknown dialogs admitted per second from one source address under -sip-unknown-dialog new-work, before ARM (0: no cap)")
	fs.DurationVar(&c.FailoverTimeout, "sip-failover-timeout", d.FailoverTimeout, "silence before new work moves to the next backend")
	fs.DurationVar(&c.InDialogTimeout, "sip-in-dialog-timeout", d.InDialogTimeout, "an in-dialog request its backend does not answer at all gets our 408 after this long (a dead backend never leaves a client in silence)")
	fs.DurationVar(&c.DrainDefault, "sip-drain-default", d.DrainDefault, "no new work to a backend that answered 503 without Retry-After for this long")
	fs.DurationVar(&c.HealthInterval, "sip-health-interval", d.HealthInterval, "OPTIONS ping period per backend (0 disables)")
	fs.DurationVar(&c.HealthTimeout, "sip-health-timeout", d.HealthTimeout, "wait for an OPTIONS answer")
	fs.IntVar(&c.HealthRise, "sip-health-rise", d.HealthRise, "answered pings in a row that bring a backend up")
	fs.IntVar(&c.HealthFall, "sip-health-fall", d.HealthFall, "unanswered pings in a row that take a backend down")
	fs.DurationVar(&c.TCPIdleTimeout, "sip-tcp-idle-timeout", d.TCPIdleTimeout, "close TCP connections idle this long")
	fs.DurationVar(&c.TCPMessageTimeout, "sip-tcp-message-timeout", d.TCPMessageTimeout, "close a TCP connection whose message is not complete this long after its first byte (not restarted per byte)")
	fs.IntVar(&c.TCPMaxConns, "sip-tcp-max-conns", d.TCPMaxConns, "most TCP connections accepted; when full, the connection idle the longest is closed for a new one")
	fs.IntVar(&c.TCPMaxConnsPerSource, "sip-tcp-max-conns-per-source", d.TCPMaxConnsPerSource, "most TCP connections accepted from one IPv4 address or IPv6 /64; more are closed at once")
	fs.DurationVar(&c.TCPFirstMessageTimeout, "sip-tcp-first-message-timeout", d.TCPFirstMessageTimeout, "close an accepted TCP connection without a complete message this long after its accept (keep-alives do not count)")
	fs.IntVar(&c.TCPPartialBudget, "sip-tcp-partial-budget", d.TCPPartialBudget, "most bytes buffered for TCP messages not yet complete, over every connection; past it the connection holding the most is closed (at least twice -sip-max-message + 1)")
	fs.IntVar(&c.UDPBuffer, "sip-udp-buffer", d.UDPBuffer, "UDP socket buffer in bytes")
	fs.IntVar(&c.MaxMessage, "sip-max-message", d.MaxMessage, "largest SIP message in bytes")
	return o
}

// enabled reports whether the SIP front end is configured.
func (o *sipOptions) enabled() bool { return len(o.backends.values) > 0 }

// config returns the Config with the parsed backends.
func (o *sipOptions) config() (lbsip.Config, error) {
	c := o.cfg
	c.Backends = nil
	for _, s := range o.backends.values {
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
	sig, cancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer cancel()
	return sipMain(sig, args, stdout, stderr)
}

// sipMain serves until sig is done, then drains for -drain-timeout.
func sipMain(sig context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("sip", stderr)
	o := addSIPFlags(fs)
	var arm listFlag
	arm.check = func(s string) error { _, err := admission.ParseRule(s); return err }
	fs.Var(&arm, "arm", "ARM rule, e.g. `name=inv,proto=sip,method=INVITE,limit=300/s,action=reject` (repeatable)")
	keyFile := fs.String("affinity-key-file", "sluice-affinity.key", "key, or key ring of \"ID HEXKEY\" lines (newest last), of affinity tokens (created when missing)")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile to this file (for benchmarks)")
	drain := fs.Duration("drain-timeout", 0, "on SIGTERM, refuse new work and keep dialogs flowing this long before exiting")
	fs.Usage = func() { groupedUsage(fs.Output(), "sip", fs) }
	if code, ok := parseCommand("sip", fs, args, stderr); !ok {
		return code
	}
	var rules []admission.RuleConfig
	for _, s := range arm.values {
		rc, err := admission.ParseRule(s)
		if err != nil {
			fmt.Fprintln(stderr, "sluice sip: -arm:", err)
			return 2
		}
		rules = append(rules, rc)
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
	ring, err := lb.LoadOrCreateKeyRing(*keyFile)
	if err != nil {
		fmt.Fprintln(stderr, "sluice sip: -affinity-key-file:", err)
		return 1
	}
	signer, err := lb.NewRingSigner(ring)
	if err != nil {
		fmt.Fprintln(stderr, "sluice sip: -affinity-key-file:", err)
		return 1
	}
	clock := admission.MonoClock{}
	adm, err := admission.NewController(admission.ControllerConfig{Rules: rules}, nil, clock.Now())
	if err != nil {
		fmt.Fprintln(stderr, "sluice sip:", flagError(err))
		return 2
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			fmt.Fprintln(stderr, "sluice sip: -cpuprofile:", err)
			return 1
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(stderr, "sluice sip: -cpuprofile:", err)
			return 1
		}
		defer func() {
			pprof.StopCPUProfile()
			f.Close()
		}()
	}
	// The server runs until after the drain, not until the signal.
	run, stop := context.WithCancel(context.Background())
	defer stop()
	go adm.Run(run, clock, 10*time.Millisecond)
	srv, err := startSIP(run, o, adm, signer, nil, logger)
	if err != nil {
		fmt.Fprintln(stderr, "sluice sip:", flagError(err))
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
