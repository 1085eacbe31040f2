package node

import (
	"fmt"
	"net"

	lbhttp "github.com/sluicelb/sluice/http"
)

// listener is one address the node listens on, with its flag.
type listener struct {
	flag, addr, what string // what: "" or a note such as "its TCP listener"
}

// listeners returns the node's TCP listeners (the SIP listener's TCP side
// included), each with its flag, for listenClash.
func (n *Node) listeners() []listener {
	c := n.cfg
	var ls []listener
	add := func(flag, addr, what string) {
		if addr != "" {
			ls = append(ls, listener{flag, addr, what})
		}
	}
	add("-admin-listen", c.AdminListen, "")
	if len(n.httpBackends) > 0 {
		if c.HTTP.Listen != lbhttp.ListenOff {
			add("-http-listen", c.HTTP.Listen, "")
		}
		add("-https-listen", c.HTTP.TLSListen, "")
		add("-http-h2c-listen", c.HTTP.H2CListen, "")
	}
	if len(n.sipBackends) > 0 {
		add("-sip-listen", c.SIP.Listen, "its TCP listener")
		add("-sip-tls-listen", c.SIP.TLSListen, "")
		add("-sip-ws-listen", c.SIP.WSListen, "")
		add("-sip-wss-listen", c.SIP.WSSListen, "")
	}
	return ls
}

// listenClash reports two of the node's listeners that would bind the
// same TCP port (the same host, or one of them every address), naming both
// flags: without it the second failed at start with "bind: address
// already in use", which reads as another process holding the port.
// Port 0 (any free port) never clashes; host names are compared as
// written.
func listenClash(ls []listener) error {
	type hp struct{ host, port string }
	parsed := make([]hp, len(ls))
	for i, l := range ls {
		h, p, err := net.SplitHostPort(l.addr)
		if err != nil {
			continue // the listener's own check names it
		}
		parsed[i] = hp{h, p}
	}
	wildcard := func(h string) bool { return h == "" || h == "0.0.0.0" || h == "::" }
	for i := range ls {
		for j := range i {
			a, b := parsed[i], parsed[j]
			if a.port == "" || a.port == "0" || a.port != b.port || (a.host != b.host && !wildcard(a.host) && !wildcard(b.host)) {
				continue
			}
			other := ls[j].flag + " " + ls[j].addr
			if ls[j].what != "" {
				other += " (" + ls[j].what + ")"
			}
			return fmt.Errorf("%s %s: %s listens on that port already: give each listener a port of its own", ls[i].flag, ls[i].addr, other)
		}
	}
	return nil
}
