package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/emiago/sipgo/sip"
)

// counters are the running totals of a scenario. Every field only grows;
// the sampler takes differences for the per-second rows.
type counters struct {
	affHTTPSent, affHTTPOK atomic.Uint64 // sticky-session requests
	affSIPSent, affSIPOK   atomic.Uint64 // in-dialog transactions (re-INVITE, BYE)

	newHTTPSent, newHTTPAdmitted, newHTTPRefused atomic.Uint64
	newSIPSent, newSIPAdmitted, newSIPRefused    atomic.Uint64
	noRetryAfter                                 atomic.Uint64 // refusals (any phase) without Retry-After
	newLost                                      atomic.Uint64 // new work that got no answer at all
	skipped                                      atomic.Uint64 // arrivals not sent: the client was at its concurrency bound

	mu       sync.Mutex
	failures []string       // first affinity failures, for the report
	refusals map[string]int // "http 503", "sip 503", ... over the whole run
	noRA     []string       // first refusals without Retry-After
	lost     []string       // first new-work requests without an answer
}

const keepExamples = 10

func (c *counters) note(list *[]string, s string) {
	c.mu.Lock()
	if len(*list) < keepExamples {
		*list = append(*list, s)
	}
	c.mu.Unlock()
}

func (c *counters) affinityFailed(s string) { c.note(&c.failures, s) }

// refused counts a refusal of new work under its protocol and status and
// checks that it says when to come back.
func (c *counters) refused(proto string, code int, retryAfter string) {
	c.mu.Lock()
	if c.refusals == nil {
		c.refusals = map[string]int{}
	}
	c.refusals[fmt.Sprintf("%s %d", proto, code)]++
	c.mu.Unlock()
	if strings.TrimSpace(retryAfter) == "" {
		c.noRetryAfter.Add(1)
		c.note(&c.noRA, fmt.Sprintf("%s %d without Retry-After", proto, code))
	}
}

// retryDelay is how long a refused set-up request waits: its Retry-After
// (seconds), bounded to [50 ms, limit].
func retryDelay(retryAfter string, limit time.Duration) time.Duration {
	d := 500 * time.Millisecond
	if s, err := strconv.Atoi(strings.TrimSpace(retryAfter)); err == nil {
		d = time.Duration(s) * time.Second
	}
	return min(limit, max(50*time.Millisecond, d))
}

// sleepCtx sleeps d or until ctx is done; false when ctx ended it.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// httpLoad sends HTTP requests through the balancer.
type httpLoad struct {
	base   string // http://127.0.0.1:PORT
	client *http.Client
	c      *counters
}

func newHTTPLoad(base string, c *counters, conns int) *httpLoad {
	tr := &http.Transport{
		MaxIdleConns:        conns,
		MaxIdleConnsPerHost: conns,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
	return &httpLoad{base: base, c: c, client: &http.Client{Transport: tr, Timeout: 10 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

func (h *httpLoad) close() { h.client.CloseIdleConnections() }

// answer is what one request got.
type answer struct {
	code       int
	retryAfter string
	backend    string // first word of the demo backend's body: h1, h2
	cookies    []*http.Cookie
}

func (h *httpLoad) get(ctx context.Context, path string, cookies map[string]string) (answer, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, h.base+path, nil)
	if err != nil {
		return answer{}, err
	}
	for name, v := range cookies {
		req.AddCookie(&http.Cookie{Name: name, Value: v})
	}
	res, err := h.client.Do(req)
	if err != nil {
		return answer{}, err
	}
	body, err := io.ReadAll(io.LimitReader(res.Body, 4096))
	res.Body.Close()
	if err != nil {
		return answer{}, err
	}
	a := answer{code: res.StatusCode, retryAfter: res.Header.Get("Retry-After"), cookies: res.Cookies()}
	if f := strings.Fields(string(body)); len(f) > 0 {
		a.backend = f[0]
	}
	return a, nil
}

// session is one sticky HTTP session: its cookies and the backend that
// served its first request.
type session struct {
	id      int
	cookies map[string]string
	backend string
}

func (s *session) take(cs []*http.Cookie) {
	for _, c := range cs {
		if c.MaxAge < 0 {
			delete(s.cookies, c.Name)
		} else {
			s.cookies[c.Name] = c.Value
		}
	}
}

// establish starts the session: its first request is new work, so a
// refusal (with Retry-After) is waited out and retried until ctx ends.
func (h *httpLoad) establish(ctx context.Context, s *session, maxWait time.Duration) error {
	for {
		a, err := h.get(ctx, fmt.Sprintf("/session/%d", s.id), nil)
		switch {
		case err != nil:
			if ctx.Err() != nil {
				return err
			}
		case a.code == http.StatusOK:
			s.cookies = map[string]string{}
			s.take(a.cookies)
			s.backend = a.backend
			return nil
		default:
			h.c.refused("http", a.code, a.retryAfter)
			if !sleepCtx(ctx, retryDelay(a.retryAfter, maxWait)) {
				return ctx.Err()
			}
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
}

// keep sends a request on the session about every interval until ctx ends.
// Each must be 200 from the session's own backend.
func (h *httpLoad) keep(ctx context.Context, s *session, interval time.Duration) {
	if !sleepCtx(ctx, time.Duration(rand.Int64N(int64(interval)))) {
		return
	}
	for ctx.Err() == nil {
		start := time.Now()
		h.c.affHTTPSent.Add(1)
		// The request itself is not cut by ctx: a session request under way
		// when the run ends still counts.
		a, err := h.get(context.Background(), fmt.Sprintf("/session/%d", s.id), s.cookies)
		switch {
		case err != nil:
			h.c.affinityFailed(fmt.Sprintf("http session %d: %v", s.id, err))
		case a.code != http.StatusOK:
			h.c.affinityFailed(fmt.Sprintf("http session %d: status %d (Retry-After %q)", s.id, a.code, a.retryAfter))
		case a.backend != s.backend:
			h.c.affinityFailed(fmt.Sprintf("http session %d: served by %s, pinned to %s", s.id, a.backend, s.backend))
		default:
			h.c.affHTTPOK.Add(1)
			s.take(a.cookies) // the backend renews its own session cookie when it expires
		}
		sleepCtx(ctx, interval-time.Since(start)+time.Duration(rand.Int64N(int64(interval/10)+1)))
	}
}

// newWork sends one request without a cookie: new work.
func (h *httpLoad) newWork(n uint64) {
	h.c.newHTTPSent.Add(1)
	a, err := h.get(context.Background(), fmt.Sprintf("/new/%d", n), nil)
	switch {
	case err != nil:
		h.c.newLost.Add(1)
		h.c.note(&h.c.lost, fmt.Sprintf("http new work: %v", err))
	case a.code == http.StatusOK:
		h.c.newHTTPAdmitted.Add(1)
	default:
		h.c.newHTTPRefused.Add(1)
		h.c.refused("http", a.code, a.retryAfter)
	}
}

// sipLoad drives SIP calls through the balancer.
type sipLoad struct {
	u       *uac
	c       *counters
	limit   time.Duration // bound on one transaction
	holding sync.WaitGroup
}

// establishDialog sets up a long dialog; a refusal is waited out and
// retried until ctx ends.
func (s *sipLoad) establishDialog(ctx context.Context, maxWait time.Duration) (*dialog, error) {
	for {
		d := s.u.newDialog("dlg")
		res, err := s.u.invite(ctx, d, s.limit)
		switch {
		case err != nil:
			if ctx.Err() != nil {
				return nil, err
			}
		case res.StatusCode < 300:
			return d, nil
		default:
			s.c.refused("sip", res.StatusCode, headerValue(res.GetHeader("Retry-After")))
			if !sleepCtx(ctx, retryDelay(headerValue(res.GetHeader("Retry-After")), maxWait)) {
				return nil, ctx.Err()
			}
		}
	}
}

// keepDialog re-INVITEs the dialog about every interval until ctx ends,
// then sends its BYE. Each transaction must end in 200.
func (s *sipLoad) keepDialog(ctx context.Context, d *dialog, interval time.Duration) {
	if sleepCtx(ctx, time.Duration(rand.Int64N(int64(interval)))) {
		for ctx.Err() == nil {
			start := time.Now()
			s.inDialog(d, "re-INVITE", s.u.reinvite)
			sleepCtx(ctx, interval-time.Since(start)+time.Duration(rand.Int64N(int64(interval/10)+1)))
		}
	}
	s.inDialog(d, "BYE", s.u.bye)
}

// inDialog runs one in-dialog transaction as affinity traffic.
func (s *sipLoad) inDialog(d *dialog, what string, do func(context.Context, *dialog, time.Duration) (*sip.Response, error)) {
	s.c.affSIPSent.Add(1)
	res, err := do(context.Background(), d, s.limit)
	switch {
	case err != nil:
		s.c.affinityFailed(fmt.Sprintf("sip %s %s: %v", what, d.callID, err))
	case res.StatusCode != 200:
		s.c.affinityFailed(fmt.Sprintf("sip %s %s: %d %s", what, d.callID, res.StatusCode, res.Reason))
	default:
		s.c.affSIPOK.Add(1)
	}
}

// newCall places one call as new work. An admitted call holds for hold
// (or until ctx ends) and then sends its BYE, which is affinity traffic.
func (s *sipLoad) newCall(ctx context.Context, hold time.Duration) {
	s.c.newSIPSent.Add(1)
	d := s.u.newDialog("new")
	res, err := s.u.invite(context.Background(), d, s.limit)
	switch {
	case err != nil:
		s.c.newLost.Add(1)
		s.c.note(&s.c.lost, fmt.Sprintf("sip new call %s: %v", d.callID, err))
		return
	case res.StatusCode >= 300:
		s.c.newSIPRefused.Add(1)
		s.c.refused("sip", res.StatusCode, headerValue(res.GetHeader("Retry-After")))
		return
	}
	s.c.newSIPAdmitted.Add(1)
	s.holding.Add(1)
	go func() {
		defer s.holding.Done()
		sleepCtx(ctx, hold)
		s.inDialog(d, "BYE", s.u.bye)
	}()
}

// offer sends new work at rate per second until ctx ends: arrivals are
// spaced evenly (open loop, whatever the answers), each runs in its own
// goroutine, at most conc at once; an arrival beyond that is counted as
// skipped, not queued.
func offer(ctx context.Context, rate float64, conc int, c *counters, send func(n uint64)) {
	if rate <= 0 {
		<-ctx.Done()
		return
	}
	sem := make(chan struct{}, conc)
	var wg sync.WaitGroup
	defer wg.Wait()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	start := time.Now()
	var sent uint64
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			due := uint64(now.Sub(start).Seconds() * rate)
			for ; sent < due; sent++ {
				select {
				case sem <- struct{}{}:
					wg.Add(1)
					go func(n uint64) {
						defer wg.Done()
						defer func() { <-sem }()
						send(n)
					}(sent)
				default:
					c.skipped.Add(1)
				}
			}
		}
	}
}

// headerValue is a SIP header's value, "" when absent.
func headerValue(h sip.Header) string {
	if h == nil {
		return ""
	}
	return h.Value()
}
