// Package http is the HTTP front end of sluice: it classifies each request
// as affinity (a valid signed sticky cookie, or a learned application
// session cookie, naming a live backend) or new work, asks admission for
// new work, picks a backend from an lb.Pool, and forwards the request over
// a keep-alive connection pool per backend.
//
// Two engines drive the connections (Config.Engine): on Linux, event loops
// over epoll that parse with fasthttp's header types (engine_loop.go and
// the loop_*.go files), and fasthttp's server with a HostClient per
// backend (engine_fasthttp.go), which also serves every connection a loop
// hands over. Both go down one request pipeline (pipeline.go: admit, pick,
// retry, abort on Critical), header rewriting (rewrite.go) and the answers
// sluice makes itself (refuse.go); an engine does only the I/O.
//
// Refusals are answered with 429 or 503, Retry-After and a Proxy-Status
// header (RFC 9209), built by writeRefusal. The package is the only
// importer of github.com/valyala/fasthttp. Callers outside alias it
// (lbhttp) because it shadows net/http.
package http
