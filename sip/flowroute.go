package sip

import (
	"bytes"
	"strconv"
	"strings"
	"time"

	gosip "github.com/emiago/sipgo/sip"
)

// Routing back to the client (RFC 3261 §16, RFC 5658, RFC 5626, RFC 3327).
//
// A client on a connection (TCP here; TLS and WebSocket where those
// listeners are served) can only be reached over that connection, and
// only through the node that holds it. So every request from such a
// client that sets up a dialog gets two Record-Routes (the client-facing
// one carries the connection's flow token, flowtoken.go), and every
// REGISTER from one gets a Path with the flow token. A request a backend
// sends towards the client carries that entry as a Route; it goes over
// the connection named (flowRequest). A connection that is gone gets 430
// Flow Failed (RFC 5626 §5.3), so the registrar or the caller tries the
// client's other flows; a token we did not sign gets 403.
//
// Only requests from backends are sent over flows: a client cannot use a
// flow token it learned (it sees the Record-Routes of its own calls) to
// reach another client without going through a backend.

// aliasParam, aliasHostParam and aliasTransportParam are the Contact
// alias's URI parameters: the signed flow token, and the host:port and
// transport of the client's own Contact, which the Request-URI gets back
// on its way to the client (they only shape that Request-URI: where the
// request goes is the flow the token names).
const (
	aliasParam          = "sla"
	aliasHostParam      = "slo"
	aliasTransportParam = "slt"
)

// maxAliasHost bounds the host:port an alias restores.
const maxAliasHost = 255

// flowRecordRoute returns our client-facing Record-Route for a client on
// flow f: the flow token in the user part (as RFC 5626 edge proxies do),
// the advertised address of the listener the client came in on and its
// transport (tcp, tls, ws, wss; RFC 7118 §5.3 for WebSocket), the
// affinity token; a sips: URI when sips and the flow is TLS
// (setRouteAddress).
func (s *Server) flowRecordRoute(token string, f flowConn, sips bool) *gosip.RecordRouteHeader {
	rr := s.ourRecordRoute(token, f.transport(), sips)
	rr.Address.User = s.flowToken(f)
	return rr
}

// flowPathValue is the Path entry (RFC 3327) for flow f: our address as
// the backend reaches it over its transport backendTr (UDP, TCP, TLS:
// the TLS listener's address and transport=tls for a TLS registrar), the
// flow token in the user part, "ob" (RFC 5626 §5.2: the flow is the one
// the client registered on).
func (s *Server) flowPathValue(f flowConn, backendTr string) string {
	u := gosip.Uri{Scheme: "sip", User: s.flowToken(f), UriParams: gosip.HeaderParams{{K: "lr"}, {K: "ob"}}}
	s.setOurAddress(&u, backendTr)
	return "<" + u.String() + ">"
}

// flowPath puts our Path on top of t's REGISTER, or updates it for this
// attempt's backend. It is added whatever the REGISTER's Supported says:
// a registrar that supports Path uses it and returns it to the client
// only when the client listed "path" (Kamailio path_mode lazy), and one
// that does not ignores it; only a registrar set to refuse Path the
// client did not ask for (Kamailio path_mode strict) answers 420, which
// says what to change. Without a Path, an incoming call for a client on
// a connection could not reach it at all.
func (s *Server) flowPath(t *txn, f flowConn, backendTr string) {
	h := gosip.NewHeader("Path", s.flowPathValue(f, backendTr))
	if t.path {
		t.req.ReplaceHeader(h)
		return
	}
	t.path = true
	s.metrics.FlowPaths.Add(1)
	t.req.PrependHeader(h)
	// Keep our Via on top.
	t.req.RemoveHeader("Via")
	t.req.PrependHeader(t.via)
}

// aliasContact rewrites the single Contact of req, from a client on flow
// f, to our address with a signed alias of the flow (-sip-contact-alias).
// The user part and the header parameters (expires, q, +sip.instance,
// reg-id) stay; the host:port and transport go into parameters that the
// Request-URI gets back on the way to the client. A Contact of "*", a
// sips: one, several, or one that does not parse is left as it is: only
// the client's own contact is aliased.
func (s *Server) aliasContact(req *gosip.Request, f flowConn, backendTr string) {
	var found gosip.Header
	for _, h := range req.Headers() {
		if !headerNamed(h.Name(), "contact") {
			continue
		}
		if found != nil {
			return
		}
		found = h
	}
	if found == nil {
		return
	}
	v := strings.TrimSpace(found.Value())
	if v == "*" || strings.IndexByte(v, ',') >= 0 {
		return
	}
	var c gosip.ContactHeader
	name, err := gosip.ParseAddressValue(v, &c.Address, &c.Params)
	if err != nil || !strings.EqualFold(c.Address.Scheme, "sip") || c.Address.Host == "" || c.Address.Raw() != "" {
		return
	}
	c.DisplayName = name
	orig := c.Address
	hp := orig.Host
	if strings.IndexByte(hp, ':') >= 0 && !strings.HasPrefix(hp, "[") {
		hp = "[" + hp + "]"
	}
	if orig.Port > 0 {
		hp += ":" + strconv.Itoa(orig.Port)
	}
	if !validAliasHost(hp) {
		return
	}
	p := gosip.HeaderParams{{K: aliasParam, V: s.flowToken(f)}, {K: aliasHostParam, V: hp}}
	if tr, ok := orig.UriParams.Get("transport"); ok && validAliasTransport(tr) {
		p = append(p, gosip.HeaderKV{K: aliasTransportParam, V: tr})
	}
	c.Address = gosip.Uri{Scheme: "sip", User: orig.User, UriParams: p}
	s.setOurAddress(&c.Address, backendTr)
	req.RemoveHeader(found.Name())
	req.AppendHeader(&c)
	s.metrics.ContactAlias.Add(1)
}

// plantedAlias reports whether a request from a client, from src,
// carries a Contact that names us with an alias parameter that is not
// the alias of src's own flow. Only aliasContact writes those, on the way
// to a backend; another the client wrote itself would be a flow token it
// learned (every party to a call sees the Record-Route and the aliased
// Contact of the other) planted as its own contact, so that a registrar
// or a peer sends the requests meant for it over another client's
// connection. Its own alias (a binding copied from a registrar's answer
// to remove it) is let through.
func (s *Server) plantedAlias(req *gosip.Request, src source) bool {
	for _, h := range req.Headers() {
		if !headerNamed(h.Name(), "contact") {
			continue
		}
		v := h.Value()
		if !strings.Contains(strings.ToLower(v), aliasParam+"=") {
			continue
		}
		for _, part := range strings.Split(v, ",") {
			var c gosip.ContactHeader
			if _, err := gosip.ParseAddressValue(strings.TrimSpace(part), &c.Address, &c.Params); err != nil {
				return true // an alias we cannot read is refused as one we can
			}
			tok, ok := c.Address.UriParams.Get(aliasParam)
			if !ok || !s.isOurs(&c.Address) {
				continue
			}
			ref, ok := s.flowSign.decode(tok)
			own := src.flow()
			if !ok || own == nil || s.flows.lookup(ref, s.flowNode()) != own {
				return true
			}
		}
	}
	return false
}

// refusePlantedAlias answers 403 to a client's request with a planted
// alias (plantedAlias); an ACK is dropped.
func (s *Server) refusePlantedAlias(req *gosip.Request, src source) {
	s.metrics.ForgedFlows.Add(1)
	if req.Method != gosip.ACK {
		s.replyLocal(req, src, 403, "Forbidden", "Warning: 399 "+s.adv.String()+` "Contact names this proxy's alias"`)
	}
}

// validAliasHost reports whether h is a host[:port] an alias may carry:
// at most maxAliasHost characters of a host name, an IPv4 address or a
// bracketed IPv6 address, and a port.
func validAliasHost(h string) bool {
	if h == "" || len(h) > maxAliasHost {
		return false
	}
	for i := 0; i < len(h); i++ {
		c := h[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '-' || c == ':' || c == '[' || c == ']') {
			return false
		}
	}
	return true
}

// validAliasTransport reports whether t is a transport token an alias
// may carry (letters only, short).
func validAliasTransport(t string) bool {
	if t == "" || len(t) > 8 {
		return false
	}
	for i := 0; i < len(t); i++ {
		if c := t[i] | 0x20; c < 'a' || c > 'z' {
			return false
		}
	}
	return true
}

// restoreAlias gives an aliased Request-URI back the client's own host,
// port and transport, and removes our parameters. A host that is not
// valid leaves the flow's address in its place.
func restoreAlias(u *gosip.Uri, f flowConn) {
	hp, _ := u.UriParams.Get(aliasHostParam)
	tr, _ := u.UriParams.Get(aliasTransportParam)
	u.UriParams.Remove(aliasParam)
	u.UriParams.Remove(aliasHostParam)
	u.UriParams.Remove(aliasTransportParam)
	u.UriParams.Remove("transport")
	host, port := "", 0
	if validAliasHost(hp) {
		host = hp
		if i := strings.LastIndexByte(hp, ':'); i >= 0 && i > strings.LastIndexByte(hp, ']') {
			if n, err := parsePort(hp[i+1:]); err == nil {
				host, port = hp[:i], n
			}
		}
		host = strings.Trim(host, "[]")
	}
	if host == "" {
		a := f.peer()
		host, port = a.Addr().String(), int(a.Port())
	}
	u.Host, u.Port = host, port
	if validAliasTransport(tr) {
		u.UriParams.Add("transport", tr)
	}
}

// flowRequest sends a request from a backend over the client flow it
// names, and reports whether it took the request: one whose Route entries
// naming us carry a flow token (our client-facing Record-Route, our
// Path), or whose Request-URI is our signed Contact alias with no other
// Route to follow. Requests from anyone but a backend are never flow
// routed here: they go on as before (a client's in-dialog request with
// our Routes goes to the backend its affinity token names).
func (s *Server) flowRequest(req *gosip.Request, src source, p *backendSet, now int64) bool {
	if p == nil || p.backendFrom(src) == nil {
		return false
	}
	flow, had := s.peekOurFlow(req)
	alias := false
	if flow == "" {
		if !s.cfg.ContactAlias || !s.isOurs(&req.Recipient) {
			return false // no alias is ours to honour without -sip-contact-alias
		}
		tok, ok := req.Recipient.UriParams.Get(aliasParam)
		if !ok {
			return false
		}
		if had {
			// Only our own entries may stand before an alias.
			for _, h := range req.Headers() {
				if r, ok := h.(*gosip.RouteHeader); ok && !s.isOurs(&r.Address) {
					return false
				}
			}
		} else if req.Route() != nil {
			return false
		}
		flow, alias = tok, true
	}
	s.popOurRoutesFlow(req)
	s.routeToFlow(req, src, p, flow, alias, now)
	return true
}

// routeToFlow checks the flow token tok and sends req, from a backend,
// over the flow it names: 403 for a token we did not sign, 430 Flow
// Failed for a flow that is gone (another node's, an earlier process's,
// a closed connection), 480 for a sips: request on a flow without TLS.
// Flow routed requests are affinity: they belong to a registration or a
// dialog the client set up through us. An initial request that can set
// up a dialog gets our two Record-Routes (client-facing with the flow
// token on top, then the backend-facing one with an affinity token
// naming the backend it came from), so the client's in-dialog requests
// come back to that backend and the backend's go over the flow.
func (s *Server) routeToFlow(req *gosip.Request, src source, p *backendSet, tok string, alias bool, now int64) {
	ack := req.Method == gosip.ACK
	ref, ok := s.flowSign.decode(tok)
	if !ok {
		s.metrics.ForgedFlows.Add(1)
		if !ack {
			what := "invalid flow token"
			if alias {
				what = "invalid contact alias"
			}
			s.replyLocal(req, src, 403, "Forbidden", "Warning: 399 "+s.adv.String()+` "`+what+`"`)
		}
		return
	}
	f := s.flows.lookup(ref, s.flowNode())
	if f == nil {
		s.flowFailed(req, src)
		return
	}
	if s.sipsDowngrade(req, f.transport()) {
		s.refuseSips(req, src, f.transport())
		return
	}
	if alias {
		restoreAlias(&req.Recipient, f)
	}
	s.admitAffinity(now, req.Method, "")
	dst := target{addr: f.peer(), tcp: true}
	br := s.branchOf(req, src, dst)
	if recordRoutes(req.Method) && toTag(req) == "" {
		if b := p.backendFrom(src); b != nil {
			token := s.routeToken("", tokenSubject(b.id, req.CallID().Value()), time.Now().Add(s.cfg.TokenTTL))
			sips := isSips(req)
			req.PrependHeader(s.flowRecordRoute(token, f, sips), s.ourRecordRoute(token, b.transport(), sips))
		}
	}
	s.prepareForward(req, src)
	via := s.ourVia(br, f.transport())
	req.PrependHeader(via)
	buf := bufPool.Get().(*bytes.Buffer)
	buf.Reset()
	req.StringWrite(buf)
	err := f.send(buf.Bytes())
	bufPool.Put(buf)
	if err != nil {
		s.metrics.SendErrors.Add(1)
		req.RemoveHeader("Via")
		s.flowFailed(req, src)
		return
	}
	s.metrics.FlowRouted.Add(1)
	s.metrics.Forwarded.Add(1)
}

// flowFailed answers 430 Flow Failed (RFC 5626 §5.3) to a request for a
// flow that is gone; an ACK is dropped.
func (s *Server) flowFailed(req *gosip.Request, src source) {
	s.metrics.FlowFailed.Add(1)
	if req.Method != gosip.ACK {
		s.reply(req, src, 430, "Flow Failed", "Warning: 399 "+s.adv.String()+` "flow gone"`)
	}
}

// isSips reports whether req is addressed to a sips: URI.
func isSips(req *gosip.Request) bool { return strings.EqualFold(req.Recipient.Scheme, "sips") }

// secureTransport reports whether a Via transport name is one over TLS.
func secureTransport(tr string) bool {
	return strings.EqualFold(tr, "TLS") || strings.EqualFold(tr, "WSS")
}

// sipsDowngrade reports whether sending req over transport would take a
// sips: request off TLS without -sip-allow-sips-downgrade (RFC 5630 §3.1.3:
// sips asks for TLS on every hop).
func (s *Server) sipsDowngrade(req *gosip.Request, transport string) bool {
	return !s.cfg.AllowSipsDowngrade && isSips(req) && !secureTransport(transport)
}

// refuseSips answers 480 with a Warning to a sips: request that would go
// on over transport; an ACK is dropped.
func (s *Server) refuseSips(req *gosip.Request, src source, transport string) {
	s.metrics.SipsRefused.Add(1)
	if req.Method != gosip.ACK {
		s.replyLocal(req, src, 480, "Temporarily Unavailable", "Warning: 399 "+s.adv.String()+` "sips: request not forwarded over `+transport+`"`)
	}
}

// transportName is the Via transport of a target: "TCP" or "UDP".
func transportName(tcp bool) string {
	if tcp {
		return "TCP"
	}
	return "UDP"
}
