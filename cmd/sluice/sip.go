package main

import (
	"flag"
	"io"

	"github.com/sluicelb/sluice/node"
)

// sipOptions holds the -sip-* flags.
type sipOptions struct {
	cfg       node.SIPConfig
	backends  listFlag
	pools     listFlag
	routes    listFlag
	wsOrigins listFlag
}

// addSIPFlags registers the SIP front end's flags on fs, with the defaults
// of node.DefaultSIPConfig, recording in fields the field each sets.
func addSIPFlags(fs *flag.FlagSet, fields map[string]string) *sipOptions {
	o := &sipOptions{cfg: node.DefaultSIPConfig()}
	c := &o.cfg
	s := newSection(fs, fields, "sip", "", c)
	s.add(&c.Listen, "sip-listen", "SIP listen address for UDP and TCP (used when a -sip-backend is given)")
	s.add(&c.Advertise, "sip-advertise", "host:port written into Via and Record-Route (default: the listen address)")
	// node sets the TLS and WebSocket handshake bound from -tls-handshake-timeout.
	s.also(&c.HandshakeTimeout, "tls-handshake-timeout")
	// node sets the SIP front end's PROXY protocol sources and timeout
	// from -proxy-protocol-from and -proxy-protocol-timeout.
	s.also(&c.ProxyFrom, "proxy-protocol-from")
	s.also(&c.ProxyTimeout, "proxy-protocol-timeout")
	o.backends.check = node.CheckSIPBackend
	s.also(&c.Backends, "sip-backend")
	fs.Var(&o.backends, "sip-backend", "SIP `backend` ADDR (or dns:HOST:PORT, srv:DOMAIN, naptr:DOMAIN: every address DNS gives, RFC 3263, followed at its TTL)[,transport=udp|tcp|tls][,ca=FILE][,sni=NAME][,weight=N][,metrics=URL][,id=NAME][,pool=NAME][,proxy=v1|v2] (repeatable, pool= too; no pool=: the pool default; proxy= with transport=tcp: one connection per client, started by a PROXY protocol header naming it)")
	o.pools.check = node.CheckPool("sip")
	fs.Var(&o.pools, "sip-pool", "settings of a SIP `pool` where they differ from the front end's: name=NAME[,policy=P] (repeatable)")
	o.routes.check = node.CheckRoute("sip")
	fs.Var(&o.routes, "sip-route", "SIP `route` of new work to a pool, first match wins (no match: the pool default, else -sip-no-route-code); in-dialog requests never consult routes: pool=NAME[,domain=H|*.H][,user=PREFIX|~REGEX][,method=M][,header=NAME:VALUE][,from-domain=H] (repeatable, in order)")
	s.add(&c.NoRouteCode, "sip-no-route-code", "final answer (400..699) to new work that no -sip-route matches when there is no pool default")
	s.add(&c.Policy, "sip-lb-policy", "selection of new work: hash (consistent hash on Call-ID), round-robin, weighted-round-robin, least-outstanding, p2c")
	s.add(&c.TokenTTL, "sip-affinity-ttl", "lifetime of the signed backend token in Record-Route (longest dialog)")
	s.add(&c.DialogTTL, "sip-dialog-ttl", "dialog table: forget a dialog after this long without an in-dialog request (a bit more than the longest call)")
	s.add(&c.AccessLogDialogs, "sip-access-log-dialogs", "with the access log: one more line per dialog when it ends (its BYE answered, else -sip-dialog-ttl after its 2xx): kind dialog, duration_ms from the 2xx, bye_side caller or callee")
	s.add(&c.DialogMax, "sip-dialog-max", "dialog table: most dialogs recorded (64 bytes each at most); when full, new dialogs' requests without our Route go by Call-ID hash")
	s.add(&c.UnknownDialog, "sip-unknown-dialog", "a request with a To-tag, no token of ours and no dialog in the table: new-work (routed by Call-ID hash, admitted like new work), reject (481) or hash (routed by Call-ID hash past every guard)")
	s.add(&c.UnknownDialogSourceRate, "sip-unknown-dialog-source-rate", "requests of unknown dialogs admitted per second from one source address under -sip-unknown-dialog new-work, before ARM (0: no cap)")
	s.add(&c.FailoverTimeout, "sip-failover-timeout", "silence before new work moves to the next backend")
	s.add(&c.InDialogTimeout, "sip-in-dialog-timeout", "an in-dialog request its backend does not answer at all gets our 408 after this long (a dead backend never leaves a client in silence)")
	s.add(&c.BusyDefault, "sip-busy-default", "a backend that answered 503 without Retry-After is busy this long: no new work to it (and the Retry-After of our own 503s)")
	renamed(fs, "sip-drain-default")
	s.add(&c.HealthInterval, "sip-health-interval", "OPTIONS ping period per backend (0 disables)")
	s.add(&c.HealthTimeout, "sip-health-timeout", "wait for an OPTIONS answer")
	s.add(&c.HealthRise, "sip-health-rise", "answered pings in a row that bring a backend up")
	s.add(&c.HealthFall, "sip-health-fall", "unanswered pings in a row that take a backend down")
	s.add(&c.TCPIdleTimeout, "sip-tcp-idle-timeout", "close TCP connections idle this long")
	s.add(&c.TCPMessageTimeout, "sip-tcp-message-timeout", "close a TCP connection whose message is not complete this long after its first byte (not restarted per byte)")
	s.add(&c.TCPMaxConns, "sip-tcp-max-conns", "most TCP connections accepted; when full, the connection idle the longest is closed for a new one")
	s.add(&c.TCPMaxConnsPerSource, "sip-tcp-max-conns-per-source", "most TCP connections accepted from one IPv4 address or IPv6 /64; more are closed at once")
	s.add(&c.TCPFirstMessageTimeout, "sip-tcp-first-message-timeout", "close an accepted TCP connection without a complete message this long after its accept (keep-alives do not count)")
	s.add(&c.TCPPartialBudget, "sip-tcp-partial-budget", "most bytes buffered for TCP messages not yet complete, over every connection; past it the connection holding the most is closed (at least twice -sip-max-message + 1)")
	s.add(&c.UDPBuffer, "sip-udp-buffer", "UDP socket buffer in bytes")
	s.add(&c.UDPBatch, "sip-udp-batch", "most UDP datagrams taken by one read (recvmmsg on Linux); 1: one datagram a call")
	s.add(&c.UDPSendBatch, "sip-udp-send-batch", "send the UDP datagrams produced while a batch of datagrams read together is handled with one sendmmsg at its end (Linux, -sip-udp-batch above 1; false: one sendto each); a batch of one sends at once")
	s.add(&c.UDPFastPath, "sip-udp-fast-path", "relay responses and a client's in-dialog ACK or BYE carrying our Route over UDP without the full SIP parse and re-serialisation when a byte scan is certain it reads them as the parser does (false: every message through the parser)")
	s.add(&c.UDPRawSend, "sip-udp-raw-send", "send UDP datagrams with raw sendto calls (Linux) instead of the runtime's syscall path, which wakes its monitor thread around each send (false: net's call)")
	s.add(&c.MaxMessage, "sip-max-message", "largest SIP message in bytes")
	s.add(&c.ContactAlias, "sip-contact-alias", "rewrite the Contact of a REGISTER or INVITE from a client connection to point at sluice with a signed alias of that connection, for backends without Path support")
	s.add(&c.AllowSipsDowngrade, "sip-allow-sips-downgrade", "let sips: requests go on over UDP or TCP (default: 480 with a Warning)")
	s.add(&c.TLSListen, "sip-tls-listen", "SIP over TLS listen `address` (sips:, transport=tls; port 5061 by custom), none by default; certificates by -tls-cert")
	s.add(&c.WSListen, "sip-ws-listen", "SIP over WebSocket listen `address` (RFC 7118), none by default")
	s.add(&c.WSSListen, "sip-wss-listen", "SIP over secure WebSocket listen `address` (RFC 7118), none by default; certificates by -tls-cert")
	s.add(&c.TLSAdvertise, "sip-tls-advertise", "`host:port` the -sip-tls-listen listener is known by (Kamailio's listen=tls:IP:5061 advertise HOST:PORT): its clients' Record-Route and what TLS backends reach us by (default: its bound address, or the -sip-advertise host with its port)")
	s.add(&c.WSAdvertise, "sip-ws-advertise", "`host:port` the -sip-ws-listen listener is known by, in its clients' Record-Route (default: its bound address, or the -sip-advertise host with its port)")
	s.add(&c.WSSAdvertise, "sip-wss-advertise", "`host:port` the -sip-wss-listen listener is known by, in its clients' Record-Route (default: its bound address, or the -sip-advertise host with its port)")
	s.add(&c.WSPath, "sip-ws-path", "the only request `path` a WebSocket handshake may ask for (404 otherwise; empty: any)")
	o.wsOrigins.check = checkWSOrigin
	s.also(&c.WSOrigins, "sip-ws-origin")
	fs.Var(&o.wsOrigins, "sip-ws-origin", "an `origin` a WebSocket handshake may come from, as a browser sends it (https://phone.example.com); repeatable; when given, handshakes from any other Origin or none get 403")
	return o
}

// checkWSOrigin validates one -sip-ws-origin value as sip.Config does.
func checkWSOrigin(v string) error {
	c := node.DefaultSIPConfig()
	c.WSOrigins = []string{v}
	return node.CheckSIPSettings(c)
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

// withLists is the SIP Config with the fields of its repeatable flags.
func (o *sipOptions) withLists() node.SIPConfig {
	c := o.cfg
	c.WSOrigins = o.wsOrigins.values
	return c
}
