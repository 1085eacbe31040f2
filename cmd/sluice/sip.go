package main

import (
	"flag"
	"io"

	"github.com/sluicelb/sluice/node"
)

// sipOptions holds the -sip-* flags.
type sipOptions struct {
	cfg      node.SIPConfig
	backends listFlag
}

// addSIPFlags registers the SIP front end's flags on fs, with the defaults
// of node.DefaultSIPConfig.
func addSIPFlags(fs *flag.FlagSet) *sipOptions {
	o := &sipOptions{}
	c := &o.cfg
	d := node.DefaultSIPConfig()
	fs.StringVar(&c.Listen, "sip-listen", d.Listen, "SIP listen address for UDP and TCP (used when a -sip-backend is given)")
	fs.StringVar(&c.Advertise, "sip-advertise", d.Advertise, "host:port written into Via and Record-Route (default: the listen address)")
	o.backends.check = node.CheckSIPBackend
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

func init() {
	register("sip", "run the balancer for SIP: `sluice run` with the same flags and defaults, one -sip-backend at least", runSIP)
}

// sipPreset makes `sluice sip` the node `sluice run` builds from the same
// flags: the same affinity key file, shutdown drain, data directory and
// admin listener, so that moving from one command to the other keeps every
// dialog's token valid. It only insists on SIP backends; an HTTP front end
// runs when asked for (-http-backend, or http lines in -backends-file).
var sipPreset = preset{
	name: "sip",
	check: func(o *runOptions) error {
		if len(o.sip.backends.values) == 0 && o.backendsFile == "" {
			return errNoSIPBackend
		}
		return nil
	},
}

// runSIP is the sip command: runRun with sipPreset.
func runSIP(args []string, stdout, stderr io.Writer) int {
	return serveUntilSignal(sipPreset, args, stdout, stderr)
}
