package http

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/sluicelb/sluice/lb"
)

// BenchmarkSessionTableInsertFull: learning a new session id when the
// table (100,000 entries, none expired) is full, as under a flood of
// anonymous sessions.
func BenchmarkSessionTableInsertFull(b *testing.B) {
	be, err := lb.NewBackend(lb.BackendConfig{ID: "b", Addr: "127.0.0.1:1", Proto: "http"})
	if err != nil {
		b.Fatal(err)
	}
	const max = 100000
	t := newSessionTable(30*time.Minute, max)
	now := int64(time.Hour)
	var id []byte
	for i := range max + max/10 {
		id = strconv.AppendInt(append(id[:0], "fill-"...), int64(i), 10)
		t.put(id, be, now)
	}
	b.ReportAllocs()
	b.ResetTimer()
	i := 0
	for b.Loop() {
		i++
		id = strconv.AppendInt(append(id[:0], "new-"...), int64(i), 10)
		t.put(id, be, now+int64(i))
	}
}

// sameShardIDs returns n ids that fall in shard 0 of a sessionTable.
func sameShardIDs(prefix string, n int) [][]byte {
	var out [][]byte
	for i := 0; len(out) < n; i++ {
		id := []byte(prefix + strconv.Itoa(i))
		if lb.HashBytes(id)&15 == 0 {
			out = append(out, id)
		}
	}
	return out
}

func testBackends(t *testing.T, names ...string) []*lb.Backend {
	t.Helper()
	var out []*lb.Backend
	for _, n := range names {
		b, err := lb.NewBackend(lb.BackendConfig{ID: n, Addr: "127.0.0.1:1", Proto: "http"})
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, b)
	}
	return out
}

// TestSessionTableFloodKeepsLiveSessions: a flood of new session ids, many
// times the table's size, never moves a session in use; the flood's ids
// replace each other, least recently used first.
func TestSessionTableFloodKeepsLiveSessions(t *testing.T) {
	bs := testBackends(t, "victim", "flood")
	tab := newSessionTable(30*time.Minute, 160) // 11 per shard
	ids := sameShardIDs("flood-", 10000)
	victims := sameShardIDs("victim-", 3)
	now := int64(time.Hour)
	for _, v := range victims {
		tab.put(v, bs[0], now)
		tab.get(v, now) // the client sent it back: a session in use
	}
	for i, id := range ids {
		now += int64(time.Millisecond)
		if !tab.put(id, bs[1], now) {
			t.Fatalf("flood id %d not learned: the flood's own ids are evictable", i)
		}
		if i%100 == 0 {
			for _, v := range victims {
				if got := tab.get(v, now); got != bs[0] {
					t.Fatalf("after %d new sessions the victim's session %s maps to %v", i, v, got)
				}
			}
		}
	}
	// The most recent flood ids are there, the oldest are not.
	if tab.get(ids[len(ids)-1], now) != bs[1] || tab.get(ids[0], now) != nil {
		t.Error("the flood's entries were not evicted least recently used first")
	}
}

// TestSessionTableFullOfLiveSessions: when every entry of a shard is a
// session in use, a new id is not learned (rather than evicting one);
// once the least recently used has been idle for liveFor, it gives way.
func TestSessionTableFullOfLiveSessions(t *testing.T) {
	bs := testBackends(t, "a", "b")
	tab := newSessionTable(30*time.Minute, 160)
	live := sameShardIDs("live-", tab.perCap)
	now := int64(time.Hour)
	for _, id := range live {
		tab.put(id, bs[0], now)
	}
	for _, id := range live {
		now += int64(time.Second)
		tab.get(id, now)
	}
	fresh := sameShardIDs("fresh-", 1)[0]
	if tab.put(fresh, bs[1], now) {
		t.Fatal("a new id evicted a session in use")
	}
	for _, id := range live {
		if tab.get(id, now) != bs[0] {
			t.Fatalf("live session %s lost", id)
		}
	}
	now += tab.liveFor
	if !tab.put(fresh, bs[1], now) || tab.get(fresh, now) != bs[1] {
		t.Fatal("not learned after the oldest session went idle")
	}
	if tab.get(live[0], now) != nil {
		t.Error("the evicted entry was not the least recently used")
	}
	for _, id := range live[1:] {
		if tab.get(id, now) != bs[0] {
			t.Fatalf("session %s lost, not the least recently used", id)
		}
	}
}

// TestSessionTableSweepsExpired: expired entries go a few per call, and
// an expired id is not returned.
func TestSessionTableSweepsExpired(t *testing.T) {
	bs := testBackends(t, "a")
	tab := newSessionTable(time.Minute, 1600)
	ids := sameShardIDs("old-", 40)
	now := int64(time.Hour)
	for _, id := range ids {
		tab.put(id, bs[0], now)
	}
	now += int64(time.Minute)
	if tab.get(ids[0], now) != nil {
		t.Fatal("an expired id is still pinned")
	}
	newIDs := sameShardIDs("new-", 10)
	for _, id := range newIDs {
		tab.put(id, bs[0], now)
	}
	// 39 expired left after the get; 10 puts sweep 4 each.
	if n, want := tab.len(), 10; n != want {
		t.Errorf("after sweeping, %d entries, want %d", n, want)
	}
}

// TestSessionTableIDLength: ids over maxSessionID are neither learned nor
// looked up.
func TestSessionTableIDLength(t *testing.T) {
	bs := testBackends(t, "a")
	tab := newSessionTable(time.Minute, 100)
	long := make([]byte, maxSessionID+1)
	for i := range long {
		long[i] = 'a'
	}
	if tab.put(long, bs[0], 1) || tab.len() != 0 {
		t.Error("an over-long id was learned")
	}
	if !tab.put(long[:maxSessionID], bs[0], 1) || tab.get(long[:maxSessionID], 2) != bs[0] {
		t.Error("an id of maxSessionID bytes was not learned")
	}
}

func TestSetCookieValue(t *testing.T) {
	wall := func() time.Time { return time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC) }
	for raw, want := range map[string]struct {
		v    string
		live bool
	}{
		"JSESSIONID=abc; Path=/; HttpOnly":                                  {"abc", true},
		`JSESSIONID="abc"; Path=/`:                                          {"abc", true},
		"JSESSIONID=; Path=/":                                               {"", false},
		`JSESSIONID=""`:                                                     {"", false},
		"JSESSIONID=abc; Max-Age=0":                                         {"abc", false},
		"JSESSIONID=abc; max-age=-1":                                        {"abc", false},
		"JSESSIONID=abc; Max-Age=60":                                        {"abc", true},
		"JSESSIONID=abc; Max-Age=x":                                         {"abc", true},
		"JSESSIONID=abc; Expires=Thu, 01 Jan 1970 00:00:00 GMT":             {"abc", false},
		"JSESSIONID=abc; expires=Thu, 01-Jan-1970 00:00:00 GMT":             {"abc", false},
		"JSESSIONID=abc; Expires=Tue, 01 Dec 2026 11:00:00 GMT":             {"abc", true},
		"JSESSIONID=abc; Max-Age=60; Expires=Thu, 01 Jan 1970 00:00:00 GMT": {"abc", true},
		"JSESSIONID=abc; Expires=Thu, 01 Jan 1970 00:00:00 GMT; Max-Age=60": {"abc", true},
	} {
		v, live := setCookieValue([]byte(raw), wall)
		if string(v) != want.v || live != want.live {
			t.Errorf("setCookieValue(%q) = %q, %v; want %q, %v", raw, v, live, want.v, want.live)
		}
	}
}

// TestAppSessionFlood: behind an application that issues a session per
// anonymous request, a flood many times -http-sticky-app-max never moves
// a user's session to another backend, on both engines.
func TestAppSessionFlood(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		r := newRig(t, rigOpts{backends: 2, cfg: Config{AppCookie: "JSESSIONID", StickyCookie: "-", AppCookieMax: 64}})
		var n atomic.Int64
		for _, be := range r.backends {
			be.handler = func(ctx *fasthttp.RequestCtx) {
				switch {
				case string(ctx.Path()) == "/logout":
					ctx.Response.Header.Add("Set-Cookie", "JSESSIONID="+string(ctx.Request.Header.Cookie("JSESSIONID"))+"; Max-Age=0; Path=/")
				case string(ctx.Path()) == "/clear":
					ctx.Response.Header.Add("Set-Cookie", "JSESSIONID=; Expires=Thu, 01 Jan 1970 00:00:00 GMT")
				case len(ctx.Request.Header.Cookie("JSESSIONID")) == 0:
					ctx.Response.Header.Add("Set-Cookie", fmt.Sprintf("JSESSIONID=s%d-%s; Path=/", n.Add(1), be.name))
				}
				ctx.SetBodyString(be.name)
			}
		}
		first := r.get("/", "")
		sid := strings.TrimSuffix(strings.TrimPrefix(first.header.Get("Set-Cookie"), "JSESSIONID="), "; Path=/")
		for i := range 600 {
			r.get("/", "")
			if i%20 == 0 {
				if rep := r.get("/", "JSESSIONID="+sid); rep.body != first.body {
					t.Fatalf("after %d new sessions the user's session went to %s, pinned to %s", i, rep.body, first.body)
				}
			}
		}
		if n := r.srv.sessions.len(); n > 16*(64/16+1) {
			t.Errorf("table holds %d entries, over its bound", n)
		}
	})
}

// TestAppCookieCleared: a Set-Cookie that clears the application cookie
// (empty value, Expires in the past, Max-Age=0) is not learned, and the id
// it names is forgotten, on both engines.
func TestAppCookieCleared(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		r := newRig(t, rigOpts{backends: 2, cfg: Config{AppCookie: "JSESSIONID", StickyCookie: "-"}})
		for _, be := range r.backends {
			be.handler = func(ctx *fasthttp.RequestCtx) {
				switch string(ctx.Path()) {
				case "/login":
					ctx.Response.Header.Add("Set-Cookie", "JSESSIONID=s-"+be.name+"; Path=/")
				case "/logout":
					ctx.Response.Header.Add("Set-Cookie", "JSESSIONID="+string(ctx.Request.Header.Cookie("JSESSIONID"))+"; Max-Age=0; Path=/")
				case "/clear":
					ctx.Response.Header.Add("Set-Cookie", "JSESSIONID=deleted; Expires=Thu, 01 Jan 1970 00:00:00 GMT")
				case "/empty":
					ctx.Response.Header.Add("Set-Cookie", `JSESSIONID=""; Path=/`)
				}
				ctx.SetBodyString(be.name)
			}
		}
		r.get("/clear", "")
		r.get("/empty", "")
		if n := r.srv.sessions.len(); n != 0 {
			t.Errorf("cleared cookies learned: %d entries", n)
		}
		first := r.get("/login", "")
		sid := "s-" + first.body
		if r.srv.sessions.get([]byte(sid), r.clock.Now()) == nil {
			t.Fatal("session not learned")
		}
		if rep := r.get("/logout", "JSESSIONID="+sid); rep.body != first.body {
			t.Fatalf("logout went to %s, pinned to %s", rep.body, first.body)
		}
		if r.srv.sessions.get([]byte(sid), r.clock.Now()) != nil {
			t.Error("a session the backend ended (Max-Age=0) is still pinned")
		}
	})
}

// TestSessionTableSourceShare: a client that takes session after session
// and sends each back (so that each is a session in use) fills at most
// its source's share of a shard; another client's new session is still
// learned, and a trusted proxy is not held to a share. Without the share,
// the attacker's sessions filled the shard and no other client's new
// session was learned for min(TTL, 5 min) after its last use of them.
func TestSessionTableSourceShare(t *testing.T) {
	bs := testBackends(t, "a", "b")
	tab := newSessionTable(30*time.Minute, 1600) // 101 per shard, 12 per source
	tab.trusted = []netip.Prefix{netip.MustParsePrefix("10.9.0.0/16")}
	now := int64(time.Hour)
	attacker := netip.MustParseAddr("192.0.2.7")
	learned := 0
	for _, id := range sameShardIDs("attacker-", 500) {
		if tab.learn(id, bs[1], lb.DefaultPool, now, attacker) {
			learned++
			tab.get(id, now)
		}
	}
	if learned > tab.perSource {
		t.Fatalf("one source got %d sessions learned in one shard; want at most %d", learned, tab.perSource)
	}
	// Another address of the attacker's IPv6 /64 shares its count.
	v6 := netip.MustParseAddr("2001:db8::1")
	n6 := 0
	for _, id := range sameShardIDs("v6-", 100) {
		if tab.learn(id, bs[1], lb.DefaultPool, now, v6) {
			n6++
		}
	}
	if other := netip.MustParseAddr("2001:db8::2"); tab.learn(sameShardIDs("v6b-", 1)[0], bs[1], lb.DefaultPool, now, other) {
		t.Fatalf("an address of a /64 holding its share (%d) got another session learned", n6)
	}
	victim := sameShardIDs("victim-", 1)[0]
	if !tab.learn(victim, bs[0], lb.DefaultPool, now+1, netip.MustParseAddr("198.51.100.1")) {
		t.Fatal("another client's new session was not learned")
	}
	if got := tab.get(victim, now+2); got != bs[0] {
		t.Fatalf("victim's session pins %v, want a", got)
	}
	proxied := 0
	for _, id := range sameShardIDs("proxy-", 50) {
		if tab.learn(id, bs[0], lb.DefaultPool, now, netip.MustParseAddr("10.9.1.1")) {
			proxied++
		}
	}
	if proxied != 50 {
		t.Fatalf("a trusted proxy got %d of 50 sessions learned", proxied)
	}
	// Entries that go give their count back.
	for _, id := range sameShardIDs("attacker-", 500) {
		tab.forget(id)
	}
	if !tab.learn(sameShardIDs("again-", 1)[0], bs[1], lb.DefaultPool, now, attacker) {
		t.Fatal("a source whose sessions were forgotten cannot have a new one learned")
	}
}
