package http

import (
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/sluicelb/sluice/admission"
	"github.com/sluicelb/sluice/lb"
)

// Proxy-Status values (RFC 9209 §2.3 error types) for the answers sluice
// makes itself. The mapping:
//
//	memory state Lower/Critical    proxy_internal_response (answered locally)
//	draining on SIGTERM            proxy_internal_response (answered locally)
//	ARM rule refusal               http_request_denied (policy)
//	no route and no default pool   destination_not_found (404)
//	MOP refusal on every backend   connection_limit_reached
//	no backend up                  destination_unavailable
//	pool drained by the operator   destination_unavailable; details="pool NAME drained"
//	backend connection limit       connection_limit_reached
//	dial refused / unreachable     connection_refused / destination_unavailable (502)
//	dial timeout                   connection_timeout (502)
//	response timeout               http_response_timeout (504)
//	backend closed the connection  connection_terminated
//	unparsable backend answer      http_protocol_error
//	broken streamed request body   http_request_error (400)
//	refused request head           http_request_error (400, 414, 431, 501, 505)
//	routes cannot tell the pool    http_request_error (400 ambiguous path,
//	                               400 duplicate routed header, 414)
var (
	psMemoryLower     = []byte(`sluice; error=proxy_internal_response; details="memory state lower"`)
	psCritical        = []byte(`sluice; error=proxy_internal_response; details="memory state critical"`)
	psDraining        = []byte(`sluice; error=proxy_internal_response; details="draining"`)
	psMOP             = []byte(`sluice; error=connection_limit_reached; details="mop"`)
	psNoBackend       = []byte(`sluice; error=destination_unavailable; details="no backend up"`)
	psConnLimit       = []byte(`sluice; error=connection_limit_reached; details="backend max conns"`)
	psSourceLimit     = []byte(`sluice; error=connection_limit_reached; details="backend conns per source"`)
	psConnRefused     = []byte(`sluice; error=connection_refused`)
	psDestUnavailable = []byte(`sluice; error=destination_unavailable`)
	psConnectTimeout  = []byte(`sluice; error=connection_timeout`)
	psResponseTimeout = []byte(`sluice; error=http_response_timeout`)
	psConnTerminated  = []byte(`sluice; error=connection_terminated`)
	psProtocolError   = []byte(`sluice; error=http_protocol_error`)
	psNoRoute         = []byte(`sluice; error=destination_not_found`)
	psBadRequest      = []byte(`sluice; error=http_request_error; details="malformed body"`)
	psHeadRefused     = []byte(`sluice; error=http_request_error`)
	psLoop            = []byte(`sluice; error=proxy_loop_detected; details="a backend leads back to this balancer"`)
	psAmbiguousPath   = []byte(`sluice; error=http_request_error; details="ambiguous path"`)
	psDupRouteHeader  = []byte(`sluice; error=http_request_error; details="duplicate routed header"`)
	psRegexPathLong   = []byte(`sluice; error=http_request_error; details="path too long for regex routes"`)
)

// psPoolDrained is the Proxy-Status of a refusal because the operator
// drained pool name (lb.Pool.DrainedByOperator): made once per pool, so a
// refusal allocates nothing. A pool name is a-z, 0-9, _ and -: nothing to
// escape.
func psPoolDrained(name string) []byte {
	if name == "" {
		name = lb.DefaultPool
	}
	return []byte(`sluice; error=destination_unavailable; details="pool ` + name + ` drained"`)
}

// Retry-After of answers that have no guard to compute one from.
const (
	memoryRetry = 5 * time.Second // in-flight request ended by Critical
	connRetry   = time.Second     // backend connection limit
)

// refuseDecision answers an admission refusal: the decision's status
// (429 for memory and ARM, -mop-reject-code for MOP) and Retry-After. An
// ARM or MOP refusal's Proxy-Status details are admission's words for it
// (Decision.Detail: "arm rule api-burst pool api", "mop pool static"),
// made in stack buffers; memory and draining refusals name the node's
// state, which is why they happen whatever the pool. It counts the
// refusal on the request's pool (p may be nil: no pool).
func (s *Server) refuseDecision(resp *fasthttp.Response, p *poolRef, d admission.Decision) {
	if p != nil && d.Reason < admission.NumReasons {
		p.stats.Refused[d.Reason].Add(1)
	}
	var ps []byte
	var msg string
	var buf [320]byte
	switch d.Reason {
	case admission.ReasonMemory:
		ps, msg = psMemoryLower, "overloaded: memory"
		if s.mem.State() == admission.Critical {
			ps = psCritical
		}
	case admission.ReasonDraining:
		ps, msg = psDraining, "shutting down"
	case admission.ReasonARM:
		ps, msg = appendProxyStatus(buf[:0], "http_request_denied", d), "rate limit exceeded"
	default:
		ps, msg = appendProxyStatus(buf[:0], "connection_limit_reached", d), "backend capacity reached"
	}
	s.writeRefusal(resp, int(d.HTTPStatus), d.RetryAfter, ps, msg)
}

// appendProxyStatus appends the Proxy-Status value `sluice; error=E;
// details="D"` with d's Detail as D, escaped as a quoted string (RFC 9651
// §3.3.3: '"' and '\' escaped; a rule name is the operator's text) and
// cut to fit a header line. It allocates nothing while dst has room.
func appendProxyStatus(dst []byte, errType string, d admission.Decision) []byte {
	var db [256]byte
	det := d.AppendDetail(db[:0])
	dst = append(dst, "sluice; error="...)
	dst = append(dst, errType...)
	dst = append(dst, `; details="`...)
	for _, c := range det {
		switch {
		case c == '"' || c == '\\':
			dst = append(dst, '\\', c)
		case c < ' ' || c >= 0x7f:
			dst = append(dst, '?')
		default:
			dst = append(dst, c)
		}
	}
	return append(dst, '"')
}

// writeNoRoute answers a request that no route takes when there is no
// default pool: 404 with Proxy-Status destination_not_found (RFC 9209
// §2.3.2), as a reverse proxy with no backend for the request does. It
// is counted in Stats.NoRoute.
func (s *Server) writeNoRoute(resp *fasthttp.Response) {
	s.writeRefusal(resp, fasthttp.StatusNotFound, 0, psNoRoute, "no route for this request")
}

// writeRouteRefusal answers a request whose pool the routes cannot tell
// for sure (routeRequest): 400 or 414, counted in Stats.BadRequest.
func (s *Server) writeRouteRefusal(resp *fasthttp.Response, why routeRefusal) {
	switch why {
	case routeAmbiguous:
		s.writeRefusal(resp, fasthttp.StatusBadRequest, 0, psAmbiguousPath, "the path reads differently raw and normalized: send it in normal form")
	case routeDupHeader:
		s.writeRefusal(resp, fasthttp.StatusBadRequest, 0, psDupRouteHeader, "a header that selects the backend is sent more than once")
	default:
		s.writeRefusal(resp, fasthttp.StatusRequestURITooLong, 0, psRegexPathLong, "path longer than "+strconv.Itoa(lb.MaxRouteRegexInput)+" bytes")
	}
}

// writeRefusal answers with status, a short text body, Proxy-Status and,
// when retry > 0 or the status is 429 or 503, Retry-After in whole seconds
// (at least 1), and Cache-Control: no-store. It is the one place where sluice's own answers are made;
// the engine sends resp its own way.
func (s *Server) writeRefusal(resp *fasthttp.Response, status int, retry time.Duration, proxyStatus []byte, msg string) {
	// Reset first: it clears every header (as ctx.Error does), so the
	// headers go on after it.
	resp.Reset()
	resp.SetStatusCode(status)
	resp.Header.SetContentType("text/plain; charset=utf-8")
	resp.SetBodyString(msg + "\n")
	resp.Header.SetBytesV("Proxy-Status", proxyStatus)
	// Never stored by a shared cache: a 404 or 400 is heuristically
	// cacheable (RFC 9110 §15.1), and an answer about this request (its
	// header, its method, the node's load) would then be served for the
	// URL to everyone.
	resp.Header.Set("Cache-Control", "no-store")
	if retry > 0 || status == fasthttp.StatusTooManyRequests || status == fasthttp.StatusServiceUnavailable {
		var buf [20]byte
		resp.Header.SetBytesV("Retry-After", strconv.AppendInt(buf[:0], int64(admission.RetryAfterSeconds(retry)), 10))
	}
}
