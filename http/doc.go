// Package http is the HTTP front end of sluice, on fasthttp: it classifies
// each request as affinity (a valid signed sticky cookie, or a learned
// application session cookie, naming a live backend) or new work, asks
// admission for new work, picks a backend from an lb.Pool, and forwards the
// request over a keep-alive connection pool per backend.
//
// Refusals are answered by one function, refuse, with 429 or 503,
// Retry-After and a Proxy-Status header (RFC 9209). The package is the
// only importer of github.com/valyala/fasthttp. Callers outside alias it
// (lbhttp) because it shadows net/http.
package http
