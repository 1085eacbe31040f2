package http

import (
	"iter"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/sluicelb/sluice/lb"
)

// maxCookieValues bounds the values of one cookie name a request is
// searched for a valid pin: checking one costs an AES-GCM open (or a
// session table lookup), and a head of 16 KiB holds hundreds.
const maxCookieValues = 4

// cookieValues yields the non-empty values of the request cookie name, in
// the order the client sent them, at most maxCookieValues. A browser sends
// every cookie of that name it holds (a sibling domain's, an older path's),
// and an attacker who planted one first must not override the client's
// own: the caller takes the first value that is valid.
func cookieValues(h *fasthttp.RequestHeader, name string) iter.Seq[[]byte] {
	return func(yield func([]byte) bool) {
		n := 0
		for k, v := range h.Cookies() {
			if len(v) == 0 || string(k) != name {
				continue
			}
			if !yield(v) {
				return
			}
			if n++; n == maxCookieValues {
				return
			}
		}
	}
}

// dropBackendSticky removes every Set-Cookie of the answer h that sets the
// balancer's own cookie: only sluice sets it (a backend that could would
// pin its clients at will), counted in Stats.CookieStripped.
func (s *Server) dropBackendSticky(h *fasthttp.ResponseHeader) {
	n := 0
	for k := range h.Cookies() {
		if string(k) == s.sticky.name {
			n++
		}
	}
	if n > 0 {
		h.DelCookie(s.sticky.name)
		s.stats.CookieStripped.Add(uint64(n))
	}
}

// stickyCookie makes the Set-Cookie value of the balancer cookie. Tokens
// have second resolution, so every response in the same second to the same
// backend carries the same value: it is built once per backend and second
// and then reused, which keeps new-work responses free of sealing work and
// allocation under load.
type stickyCookie struct {
	name   string
	ttl    time.Duration
	signer *lb.Signer
}

type cookieValue struct {
	expires int64 // unix seconds
	header  []byte
}

func newStickyCookie(name string, ttl time.Duration, signer *lb.Signer) *stickyCookie {
	return &stickyCookie{name: name, ttl: ttl, signer: signer}
}

// header returns the Set-Cookie value pinning b, valid from now for ttl.
// slot caches it for b (see route.cookies).
func (s *stickyCookie) header(slot *atomic.Pointer[cookieValue], b *lb.Backend, now time.Time) []byte {
	exp := now.Add(s.ttl).Unix()
	if v := slot.Load(); v != nil && v.expires == exp {
		return v.header
	}
	tok := s.signer.Token(b.ID(), time.Unix(exp, 0))
	h := make([]byte, 0, len(s.name)+len(tok)+64)
	h = append(h, s.name...)
	h = append(h, '=')
	h = append(h, tok...)
	h = append(h, "; Path=/; Max-Age="...)
	h = strconv.AppendInt(h, int64(s.ttl/time.Second), 10)
	h = append(h, "; HttpOnly; SameSite=Lax"...)
	slot.Store(&cookieValue{expires: exp, header: h})
	return h
}

// sessionTable maps application session ids (e.g. JSESSIONID values) to
// the backend that issued them, with a TTL refreshed on use. It is bounded:
// when a shard is full, expired entries go first, then an arbitrary one.
type sessionTable struct {
	ttl    int64 // ns
	perCap int
	shards [16]sessionShard
}

type sessionShard struct {
	mu sync.Mutex
	m  map[string]sessionEntry
}

type sessionEntry struct {
	backend *lb.Backend
	expires int64 // monotonic ns
}

func newSessionTable(ttl time.Duration, max int) *sessionTable {
	t := &sessionTable{ttl: int64(ttl), perCap: max/16 + 1}
	for i := range t.shards {
		t.shards[i].m = make(map[string]sessionEntry)
	}
	return t
}

func (t *sessionTable) shard(id []byte) *sessionShard {
	return &t.shards[lb.HashBytes(id)&15]
}

// get returns the backend id is pinned to at now, or nil, and extends its
// lifetime. It does not allocate.
func (t *sessionTable) get(id []byte, now int64) *lb.Backend {
	s := t.shard(id)
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.m[string(id)]
	if !ok {
		return nil
	}
	if now >= e.expires {
		delete(s.m, string(id))
		return nil
	}
	e.expires = now + t.ttl
	s.m[string(id)] = e
	return e.backend
}

// put pins id to b from now.
func (t *sessionTable) put(id []byte, b *lb.Backend, now int64) {
	s := t.shard(id)
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.m[string(id)]; ok {
		e.backend, e.expires = b, now+t.ttl
		s.m[string(id)] = e
		return
	}
	if len(s.m) >= t.perCap {
		for k, e := range s.m {
			if now >= e.expires {
				delete(s.m, k)
			}
		}
		for k := range s.m {
			if len(s.m) < t.perCap {
				break
			}
			delete(s.m, k)
		}
	}
	s.m[string(id)] = sessionEntry{backend: b, expires: now + t.ttl}
}

// forget removes id, e.g. when the backend cleared the cookie.
func (t *sessionTable) forget(id []byte) {
	s := t.shard(id)
	s.mu.Lock()
	delete(s.m, string(id))
	s.mu.Unlock()
}

// len returns the number of entries, for tests and status.
func (t *sessionTable) len() int {
	n := 0
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		n += len(s.m)
		s.mu.Unlock()
	}
	return n
}
