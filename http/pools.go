package http

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/valyala/fasthttp"

	"github.com/sluicelb/sluice/lb"
)

// backendSet is what requests go to: the pools of one backend generation
// (or the one pool SetPool was given), the routes that choose among them,
// and what the front end keeps per backend (the fasthttp engine's
// connection pool) and per pool (hash key, sticky cookie cache, counters).
// A request loads it once (plan.set) and uses it throughout, so a
// SetGeneration in the middle of a request does not mix two sets. The
// loop engine keeps its connections per address in each loop (connPool),
// so they outlive a swap by themselves.
type backendSet struct {
	gen      *lb.Generation         // nil: built from one pool (SetPool)
	backends []*lb.Backend          // every backend once
	addrs    map[string]struct{}    // their addresses: a loop keeps its pools of these (engine_loop.go, expire)
	clients  []*fasthttp.HostClient // fasthttp engine, by Backend.Index: one per backend, shared by its pools
	pools    []*poolRef             // in the generation's order (DefaultPool first)
	byName   map[string]*poolRef
	def      *poolRef // DefaultPool: new work no route takes; nil when there is none

	routes     *lb.RouteTable // nil: no routes
	routePools []*poolRef     // by route index
	strips     []string       // by route index: the route's strip= ("" none)
	routeIDs   []string       // by route index: its number from 1, as the access log names it
	needPath   bool           // a route tests or strips the path
	needMethod bool           // a route tests the method
	hdrNames   []string       // the header names routes test (RouteTable.HeaderNames)
	testsPath  bool           // a route tests the path (path=/PREFIX or path=~REGEX)
	hasRegex   bool           // a route has path=~REGEX (RouteTable.HasRegex)

	// tables are the route tables a pin may be honoured by (see
	// Server.affinity): this set's first, then up to maxPastTables that
	// earlier sets served, newest first. Empty for a set built from one
	// pool (SetPool).
	tables []routeTable
}

// maxPastTables is how many route tables served before the current one a
// session may still be honoured by: a route change, or a reload that
// changes routes, keeps a session in the pool the routes gave it for the
// next few changes, and no pin ever reaches a pool none of these tables
// sends its request to.
const maxPastTables = 4

// routeTable is one route table as the front end served it: where it
// sent a request, by pool name.
type routeTable struct {
	table      *lb.RouteTable // nil: no routes
	pools      []string       // by route index
	def        bool           // it had a default pool (no match: DefaultPool)
	hdrNames   []string
	needMethod bool
	needPath   bool
}

// same reports whether t and u send every request to the same pool.
func (t *routeTable) same(u *routeTable) bool {
	if t.def != u.def || t.table.Len() != u.table.Len() {
		return false
	}
	for i := range t.table.Len() {
		if t.table.Spec(i) != u.table.Spec(i) {
			return false
		}
	}
	return true
}

// dest is the pool t sends the request r describes to: the first route
// r matches names it, or no route matches and t had a default pool; ""
// when neither, when r sends a header t tests twice, or when r's raw path
// (when it differs from the normalized one) would go elsewhere. It
// allocates nothing.
func (t *routeTable) dest(r *routedReq) string {
	in := lb.RouteInput{Host: r.v.host, Path: r.v.path}
	if t.needMethod {
		in.Method = r.h.Method()
	}
	for i, name := range t.hdrNames {
		v, dup := peekOnce(r.h, name)
		if dup {
			return ""
		}
		in.Headers[i] = v
	}
	d := t.destInput(&in)
	if r.raw != nil {
		in.Path = r.raw
		if t.destInput(&in) != d {
			return ""
		}
	}
	return d
}

func (t *routeTable) destInput(in *lb.RouteInput) string {
	if i := t.table.Select(in); i >= 0 {
		return t.pools[i]
	}
	if t.def {
		return lb.DefaultPool
	}
	return ""
}

// routedReq is what the routes of any table the set keeps may test of
// one request: its head, its normalized view, and its raw path when that
// differs from the normalized one (nil otherwise). It remembers where
// each past table sends the request, so that however many cookies a
// request carries, each table is consulted once.
type routedReq struct {
	h    *fasthttp.RequestHeader
	v    *reqView
	raw  []byte
	dest [maxPastTables]string // by past table: the pool it sends the request to
	done uint8                 // bit i: dest[i] is known
}

// sendsAny reports whether a route table served before the current one,
// among those set keeps, sends the request r describes to pool (the
// current one sends it to the routed pool only).
func (set *backendSet) sendsAny(r *routedReq, pool string) bool {
	for i := range set.tables[min(1, len(set.tables)):] {
		if r.done&(1<<i) == 0 {
			r.dest[i] = set.tables[1+i].dest(r)
			r.done |= 1 << i
		}
		if r.dest[i] == pool {
			return true
		}
	}
	return false
}

// poolRef is one pool as the front end serves it.
type poolRef struct {
	pool *lb.Pool
	name string // the pool's name
	// tag is the name the pool goes by in sticky tokens, learned sessions
	// and admission's Request.Pool: its name, "" for the one pool of a
	// front end without pools (SetPool), whose tokens stay as they were.
	tag      string
	hashKind hashKind // the pool's hash key (PoolSpec.HashKey, else -http-hash-key), parsed once
	hashName string
	hashed   bool // the pool's policy uses the key
	// cookies caches the Set-Cookie value pinning each backend in this
	// pool, by Backend.Index (the token names the pool).
	cookies []atomic.Pointer[cookieValue]
	path    string     // the sticky cookie's Path (cookiePath)
	stats   *poolStats // kept by name across sets
	// psDrained is the Proxy-Status of a refusal because the operator
	// drained every backend of the pool that would take new work.
	psDrained []byte
}

// newBackendSet builds the set serving g's pools and routes (g nil: the
// one pool one), reusing the fasthttp connection pools of old for
// backends at the same address. It checks what only the front end can:
// each pool's hash key.
func (s *Server) newBackendSet(g *lb.Generation, one *lb.Pool, routes *lb.RouteTable, old *backendSet) (*backendSet, error) {
	set := &backendSet{gen: g, byName: map[string]*poolRef{}}
	var pools []*lb.Pool
	if g != nil {
		set.backends, pools = g.Backends(), g.Pools()
	} else {
		set.backends, pools = one.Backends(), []*lb.Pool{one}
	}
	if len(pools) == 0 {
		return nil, errors.New("no pools")
	}
	n := 0 // clients are by Index: a pool built alone numbers its backends itself
	set.addrs = make(map[string]struct{}, len(set.backends))
	for _, b := range set.backends {
		n = max(n, b.Index()+1)
		set.addrs[b.Addr()] = struct{}{}
	}
	for _, p := range pools {
		ref := &poolRef{pool: p, name: p.Name(), hashKind: s.hashKind, hashName: s.hashName, cookies: make([]atomic.Pointer[cookieValue], n)}
		ref.psDrained = psPoolDrained(ref.name)
		if g != nil {
			if spec, ok := g.PoolSpec(p.Name()); ok && spec.HashKey != "" {
				k, name, err := parseHashKey(spec.HashKey)
				if err != nil {
					return nil, fmt.Errorf("pool %s: hash-key %q: want source, header:NAME or cookie:NAME", p.Name(), spec.HashKey)
				}
				ref.hashKind, ref.hashName = k, name
			}
		}
		if g != nil {
			ref.tag = ref.name
		}
		_, ref.hashed = p.Policy().(*lb.ConsistentHash)
		ref.stats = s.poolStats(ref.name)
		set.pools = append(set.pools, ref)
		set.byName[ref.name] = ref
	}
	if g == nil {
		set.def = set.pools[0] // one pool takes everything, whatever its name
	} else {
		set.def = set.byName[lb.DefaultPool]
	}
	if routes != nil && routes.Len() > 0 {
		set.routes = routes
		set.routePools = make([]*poolRef, routes.Len())
		set.strips = make([]string, routes.Len())
		set.routeIDs = make([]string, routes.Len())
		for i := range routes.Len() {
			spec := routes.Spec(i)
			ref := set.byName[spec.Pool]
			if ref == nil {
				return nil, fmt.Errorf("route %d (%s): pool %s has no backends", i+1, spec, spec.Pool)
			}
			set.routePools[i], set.strips[i] = ref, spec.Strip
			set.routeIDs[i] = strconv.Itoa(i + 1)
			set.needPath = set.needPath || spec.Prefix != "" || spec.Regex != "" || spec.Strip != ""
			set.needMethod = set.needMethod || spec.Method != ""
		}
		set.hdrNames = routes.HeaderNames()
		set.hasRegex = routes.HasRegex()
		for i := range routes.Len() {
			spec := routes.Spec(i)
			set.testsPath = set.testsPath || spec.Prefix != "" || spec.Regex != ""
		}
	}
	if g != nil {
		cur := routeTable{table: set.routes, def: set.def != nil, hdrNames: set.hdrNames, needMethod: set.needMethod, needPath: set.needPath}
		for i := range set.routes.Len() {
			cur.pools = append(cur.pools, set.routes.Spec(i).Pool)
		}
		set.tables = append(set.tables, cur)
		if old != nil && len(old.tables) > 0 {
			past := old.tables
			if past[0].same(&cur) {
				past = past[1:]
			}
			set.tables = append(set.tables, past[:min(len(past), maxPastTables)]...)
		}
		for _, t := range set.tables {
			set.needPath = set.needPath || t.needPath
		}
	}
	for _, ref := range set.pools {
		ref.path = cookiePath(set, ref)
	}

	// Plain connections are kept across generations by address; a TLS
	// backend gets a new pool with each generation's TLS settings (its
	// CA or name may have changed).
	reuse := map[string]*fasthttp.HostClient{}
	var retired []*fasthttp.HostClient // the old set's TLS pools
	if old != nil {
		for _, b := range old.backends {
			switch c := old.clients[b.Index()]; {
			case c == nil:
			case b.TLS() == nil:
				reuse[b.Addr()] = c
			default:
				retired = append(retired, c)
			}
		}
	}
	set.clients = make([]*fasthttp.HostClient, n)
	for _, b := range set.backends {
		c, ok := reuse[b.Addr()]
		if b.TLS() != nil {
			c, ok = nil, false
		} else {
			delete(reuse, b.Addr())
		}
		if !ok {
			c = s.newClient(b.Addr(), s.cfg.ResponseBuffer, b.TLS())
		}
		set.clients[b.Index()] = c
	}
	for _, c := range reuse { // backends removed: close their idle connections
		c.CloseIdleConnections()
	}
	for _, c := range retired {
		c.CloseIdleConnections()
	}
	return set, nil
}

// SetGeneration makes g the backends the server serves: its pools, each
// with its policy and hash key, and its routes (g.Routes). Requests under
// way finish on the set they started with; connection pools of backends
// whose address stays are kept (one per backend, whatever the number of
// its pools). Sticky cookies and learned session ids name the pool and
// the backend: a session stays in its pool across a route change while
// its pool exists and holds its backend, for requests the new routes or
// one of the last maxPastTables route tables send to that pool (the set
// keeps them: a generation with the same routes does not age them).
//
// It returns an error, and changes nothing, when g is nil or a pool's
// hash key is not one the front end reads.
func (s *Server) SetGeneration(g *lb.Generation) error {
	if g == nil {
		return errors.New("set http backends: nil generation")
	}
	if g.Proto() != "http" {
		return fmt.Errorf("set http backends: a %s generation", g.Proto())
	}
	old := s.backends.Load()
	set, err := s.newBackendSet(g, nil, g.Routes(), old)
	if err != nil {
		return fmt.Errorf("set http backends: %w", err)
	}
	if old != nil && old.gen != nil {
		// What changed on old's backends since g was built (its Start ran
		// a first round of probes meanwhile): lb.Generation.CatchUp.
		g.CatchUp(old.gen, s.clock.Now())
	}
	s.install(set)
	s.logger.Info("http backends set", "backends", len(set.backends), "pools", len(set.pools), "routes", set.routes.Len())
	return nil
}

// SetPool replaces the backends with one pool, which takes every request
// (it is the default pool whatever its name; there are no routes), for a
// front end without pools. See SetGeneration.
func (s *Server) SetPool(pool *lb.Pool) error {
	if pool == nil {
		return errors.New("set http backends: nil pool")
	}
	set, err := s.newBackendSet(nil, pool, nil, s.backends.Load())
	if err != nil {
		return fmt.Errorf("set http backends: %w", err)
	}
	s.install(set)
	s.logger.Info("http backends set", "backends", pool.Len())
	return nil
}

// install makes set the one requests load, and keeps the per-pool
// counters of its pools only (their number stays bounded by one
// generation's pools).
func (s *Server) install(set *backendSet) {
	s.backends.Store(set)
	s.poolMu.Lock()
	for name := range s.poolCounters {
		if set.byName[name] == nil {
			delete(s.poolCounters, name)
		}
	}
	s.poolMu.Unlock()
	deny := denyList(s.connDeny, set)
	s.denyNames.Store(&deny)
}

// poolStats returns the counters of the pool called name, made on first
// use; a pool keeps them across sets while it exists.
func (s *Server) poolStats(name string) *poolStats {
	s.poolMu.Lock()
	defer s.poolMu.Unlock()
	if s.poolCounters == nil {
		s.poolCounters = map[string]*poolStats{}
	}
	st := s.poolCounters[name]
	if st == nil {
		st = new(poolStats)
		s.poolCounters[name] = st
	}
	return st
}

// denyList is the header names a request's Connection may not name
// (lower case): the front end's hash header, each pool's, and each header
// a route tests. Removing one as hop-by-hop would change where the
// request goes, or let a request route on a header its backend never
// sees.
func denyList(front string, set *backendSet) []string {
	var l []string
	add := func(n string) {
		if n = strings.ToLower(n); n != "" {
			for _, x := range l {
				if x == n {
					return
				}
			}
			l = append(l, n)
		}
	}
	add(front)
	for _, p := range set.pools {
		if p.hashKind == hashHeader {
			add(p.hashName)
		}
	}
	for _, n := range set.hdrNames {
		add(n)
	}
	return l
}

// Pool returns the default pool in use (the pool new work that no route
// takes goes to), else the first pool.
func (s *Server) Pool() *lb.Pool {
	set := s.backends.Load()
	if set.def != nil {
		return set.def.pool
	}
	return set.pools[0].pool
}

// Generation returns the generation in use, nil when the server serves
// one pool (SetPool, Deps.Pool).
func (s *Server) Generation() *lb.Generation { return s.backends.Load().gen }

// cookiePath is the Path of the sticky cookie of pool ref: the path the
// pool's routes have in common when every route to it names a path
// prefix, else "/" (and "/" for the default pool, which takes what no
// route does). A client keeps one cookie per name and Path: a pool
// routed by path prefix on a host shared with other pools gets its own
// cookie, which the browser sends only under that prefix, so that a
// session in one pool does not ride along to another pool's paths,
// where the routes would not honour it (Server.affinity) and the request
// would overwrite it with the other pool's cookie.
func cookiePath(set *backendSet, ref *poolRef) string {
	if ref == set.def || set.routes == nil {
		return "/"
	}
	common, any := "", false
	for i, to := range set.routePools {
		if to != ref {
			continue
		}
		p := set.routes.Spec(i).Prefix
		if p == "" {
			return "/"
		}
		if !any {
			common, any = p, true
			continue
		}
		n := 0
		for n < len(common) && n < len(p) && common[n] == p[n] {
			n++
		}
		if n < len(common) {
			// Cut where a segment ends: a cookie's Path matches whole
			// segments (RFC 6265 §5.1.4).
			common = common[:strings.LastIndexByte(common[:n], '/')+1]
		}
	}
	if !any || common == "" || strings.ContainsFunc(common, func(r rune) bool { return r <= ' ' || r >= 0x7f || r == ';' || r == ',' }) {
		return "/"
	}
	return common
}
