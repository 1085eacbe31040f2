package http

import (
	"iter"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/sluicelb/sluice/lb"
)

// maxCookieValues bounds the values of one cookie name a request is
// searched for a valid pin: checking a well-formed token costs an AES-GCM
// open (0.1-0.2 µs; others fail on their form), and a head of 16 KiB holds
// hundreds. A browser sends cookies with longer paths first, so someone
// who plants cookies (a sibling domain) must plant this many to hide the
// client's own.
const maxCookieValues = 16

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
	secure  []byte // header with the Secure attribute, for clients over TLS
}

func newStickyCookie(name string, ttl time.Duration, signer *lb.Signer) *stickyCookie {
	return &stickyCookie{name: name, ttl: ttl, signer: signer}
}

// header returns the Set-Cookie value pinning b in pool (the token
// carries the pool's name), valid from now for ttl, with the pool's
// cookie Path (poolRef.path), Secure for a client over TLS (secure): a
// browser then never sends it over plain HTTP, where it could be read on
// the way. slot caches both forms for b (see poolRef.cookies).
func (s *stickyCookie) header(slot *atomic.Pointer[cookieValue], pool, path string, b *lb.Backend, now time.Time, secure bool) []byte {
	exp := now.Add(s.ttl).Unix()
	if v := slot.Load(); v != nil && v.expires == exp {
		if secure {
			return v.secure
		}
		return v.header
	}
	tok := s.signer.PoolToken(pool, b.ID(), time.Unix(exp, 0))
	h := make([]byte, 0, len(s.name)+len(tok)+len(path)+64)
	h = append(h, s.name...)
	h = append(h, '=')
	h = append(h, tok...)
	h = append(h, "; Path="...)
	h = append(h, path...)
	h = append(h, "; Max-Age="...)
	h = strconv.AppendInt(h, int64(s.ttl/time.Second), 10)
	h = append(h, "; HttpOnly; SameSite=Lax; Secure"...)
	n := len(h) - len("; Secure")
	v := &cookieValue{expires: exp, header: h[:n:n], secure: h}
	slot.Store(v)
	if secure {
		return v.secure
	}
	return v.header
}

// sessionTable maps application session ids (e.g. JSESSIONID values) to
// the backend that issued them, with a TTL refreshed on use. It is bounded,
// and a flood of new sessions (an application that issues one per
// anonymous request) must not push out the sessions of users at work. So
// each of its 16 shards is a segmented LRU:
//
//   - a new id goes to the front of the probation list;
//   - an id a client sends back (get) moves to the front of the protected
//     list: it is a session in use;
//   - when a shard is full, the least recently used probation entry goes,
//     else the least recently used protected one if it has been idle for
//     liveFor; otherwise the new id is not learned (put returns false;
//     Stats.SessionNotLearned): not pinning a new session costs less than
//     moving a user's session under way to another backend;
//   - one source (the client address, an IPv6 /64; trusted proxies
//     excepted) holds at most an eighth of a shard: a client that takes
//     sessions and sends each back keeps them protected, and without a
//     share one client could fill every shard with them, so that no other
//     client's new session was learned (and the sessions of users idle
//     over liveFor were evicted for its new ones).
//
// Expired entries are swept from the lists' tails a few per call, so no
// call scans a shard: put and get are O(1).
type sessionTable struct {
	ttl       int64 // ns
	liveFor   int64 // ns: a protected entry used this recently is not evicted
	perCap    int
	perSource int            // entries of a shard one source may hold
	trusted   []netip.Prefix // sources not counted (-http-trusted-proxy)
	shards    [16]sessionShard
}

// maxSessionID bounds the length of a session id that is learned or
// looked up: real ones are 20-100 bytes (a JSESSIONID with a jvmRoute is
// about 40).
const maxSessionID = 256

// sweepPerCall bounds the expired entries one call removes.
const sweepPerCall = 4

type sessionShard struct {
	mu        sync.Mutex
	m         map[string]*sessionEntry
	probation sessionEntry // list sentinels: next is the most recently used
	protected sessionEntry
	bySource  map[netip.Addr]int32 // entries per counted source
}

type sessionEntry struct {
	id         string
	src        netip.Addr // the source it is counted for; invalid: none
	backend    *lb.Backend
	pool       string // the pool the session is in
	used       int64  // monotonic ns of the last use
	protected  bool
	prev, next *sessionEntry
}

func newSessionTable(ttl time.Duration, max int) *sessionTable {
	t := &sessionTable{ttl: int64(ttl), liveFor: int64(min(ttl, 5*time.Minute)), perCap: max/16 + 1}
	if t.perSource = t.perCap / 8; t.perSource < 1 {
		t.perSource = 1
	}
	for i := range t.shards {
		s := &t.shards[i]
		s.m = make(map[string]*sessionEntry)
		s.bySource = make(map[netip.Addr]int32)
		s.probation.prev, s.probation.next = &s.probation, &s.probation
		s.protected.prev, s.protected.next = &s.protected, &s.protected
	}
	return t
}

func (t *sessionTable) shard(id []byte) *sessionShard {
	return &t.shards[lb.HashBytes(id)&15]
}

func (e *sessionEntry) unlink() {
	e.prev.next, e.next.prev = e.next, e.prev
	e.prev, e.next = nil, nil
}

// pushFront puts e at the front of the list whose sentinel is l.
func (l *sessionEntry) pushFront(e *sessionEntry) {
	e.prev, e.next = l, l.next
	l.next.prev = e
	l.next = e
}

// sweep removes up to sweepPerCall expired entries from the lists' tails
// (each list is in order of last use).
func (t *sessionTable) sweep(s *sessionShard, now int64) {
	n := 0
	for _, l := range [2]*sessionEntry{&s.probation, &s.protected} {
		for e := l.prev; e != l && n < sweepPerCall && now-e.used >= t.ttl; e = l.prev {
			s.remove(e)
			n++
		}
	}
}

func (s *sessionShard) remove(e *sessionEntry) {
	e.unlink()
	delete(s.m, e.id)
	if e.src.IsValid() {
		if n := s.bySource[e.src] - 1; n > 0 {
			s.bySource[e.src] = n
		} else {
			delete(s.bySource, e.src)
		}
	}
}

// counted returns the key ip is counted under in the per-source shares
// (invalid: not counted, for a trusted proxy or no address).
func (t *sessionTable) counted(ip netip.Addr) netip.Addr {
	if !ip.IsValid() {
		return netip.Addr{}
	}
	for _, p := range t.trusted {
		if p.Contains(ip) {
			return netip.Addr{}
		}
	}
	return source(ip)
}

// get is lookup without the pool (tests).
func (t *sessionTable) get(id []byte, now int64) *lb.Backend {
	b, _ := t.lookup(id, now)
	return b
}

// lookup returns the backend id is pinned to at now and its pool, or
// nil, and extends its lifetime: the entry is a session in use. It does
// not allocate.
func (t *sessionTable) lookup(id []byte, now int64) (*lb.Backend, string) {
	if len(id) > maxSessionID {
		return nil, ""
	}
	s := t.shard(id)
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.m[string(id)]
	if !ok {
		return nil, ""
	}
	if now-e.used >= t.ttl {
		s.remove(e)
		return nil, ""
	}
	e.used = now
	e.protected = true
	e.unlink()
	s.protected.pushFront(e)
	return e.backend, e.pool
}

// put pins id to b in pool DefaultPool from now, for no counted source
// (tests).
func (t *sessionTable) put(id []byte, b *lb.Backend, now int64) bool {
	return t.learn(id, b, lb.DefaultPool, now, netip.Addr{})
}

// learn pins id to b in pool from now (pool is a name that outlives the
// request: the pool's own); ip is the client whose request the answer
// setting it was to. It returns false when id was not learned: too long,
// the shard full of sessions in use, or ip's source holding its share of
// the shard.
func (t *sessionTable) learn(id []byte, b *lb.Backend, pool string, now int64, ip netip.Addr) bool {
	if len(id) == 0 || len(id) > maxSessionID {
		return false
	}
	s := t.shard(id)
	s.mu.Lock()
	defer s.mu.Unlock()
	t.sweep(s, now)
	if e, ok := s.m[string(id)]; ok {
		e.backend, e.pool, e.used = b, pool, now
		e.unlink()
		if e.protected {
			s.protected.pushFront(e)
		} else {
			s.probation.pushFront(e)
		}
		return true
	}
	src := t.counted(ip)
	if src.IsValid() && int(s.bySource[src]) >= t.perSource {
		return false
	}
	var e *sessionEntry
	if len(s.m) >= t.perCap {
		switch {
		case s.probation.prev != &s.probation:
			e = s.probation.prev
		case now-s.protected.prev.used >= t.liveFor:
			e = s.protected.prev
		default:
			return false
		}
		s.remove(e) // reused for the new id
	} else {
		e = new(sessionEntry)
	}
	*e = sessionEntry{id: string(id), src: src, backend: b, pool: pool, used: now}
	s.m[e.id] = e
	if src.IsValid() {
		s.bySource[src]++
	}
	s.probation.pushFront(e)
	return true
}

// forget removes id, e.g. when the backend cleared the cookie.
func (t *sessionTable) forget(id []byte) {
	if len(id) > maxSessionID {
		return
	}
	s := t.shard(id)
	s.mu.Lock()
	if e, ok := s.m[string(id)]; ok {
		s.remove(e)
	}
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
