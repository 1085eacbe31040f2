package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicelb/sluice/admin"
	"github.com/sluicelb/sluice/lb"
)

// poolBackend starts a backend that answers "NAME PATH" and returns its
// spec in pool.
func poolBackend(t *testing.T, name string, pools ...string) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, name+" "+r.URL.RequestURI()) }))
	t.Cleanup(srv.Close)
	spec := srv.Listener.Addr().String() + ",id=" + name
	for _, p := range pools {
		spec += ",pool=" + p
	}
	return spec
}

// getHost is a GET of front+path with Host host, without cookies: new
// work every time. It returns the status and the body.
func getHost(t *testing.T, front, host, path string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", front+path, nil)
	if host != "" {
		req.Host = host
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

func postBody(t *testing.T, u, body string) (int, string) {
	t.Helper()
	resp, err := http.Post(u, "text/plain", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestPoolsAndRoutesEndToEnd: two HTTP pools besides the pool default,
// behind a host route and a path route with strip; a route added and
// removed through the control API changes where new requests go, with an
// event naming who changed what; the route list survives a restart on the
// same data directory; GET /control/config reads back to the same pools
// and routes; draining a pool leaves the others untouched.
func TestPoolsAndRoutesEndToEnd(t *testing.T) {
	cfg := testConfig(t)
	cfg.HTTPBackends = []string{poolBackend(t, "web1"), poolBackend(t, "api1", "api"), poolBackend(t, "api2", "api"), poolBackend(t, "static1", "static")}
	cfg.HTTPPools = []string{"name=api,policy=round-robin", "name=static,policy=least-outstanding,health=/healthz"}
	cfg.HTTPRoutes = []string{"pool=api,host=api.example.com", "pool=static,path=/static/,strip=/static"}
	cfg.AdminListen = "127.0.0.1:0"
	n, front, adm := controlNode(t, cfg)

	g := n.Generation("http")
	var names []string
	for _, p := range g.Pools() {
		names = append(names, p.Name())
	}
	if want := []string{"default", "api", "static"}; !slices.Equal(names, want) {
		t.Fatalf("pools %v, want %v", names, want)
	}
	if ps, _ := g.PoolSpec("static"); ps.Policy != "least-outstanding" || ps.HealthPath != "/healthz" {
		t.Errorf("pool static: %+v", ps)
	}

	expect := func(host, path, want string) {
		t.Helper()
		for range 4 {
			code, body := getHost(t, front, host, path)
			if code != 200 || !strings.HasPrefix(body, want) {
				t.Fatalf("GET %s (Host %q): %d %q, want 200 from %s", path, host, code, body, want)
			}
		}
	}
	expect("api.example.com", "/v1/x", "api")
	expect("API.Example.com:80", "/v1/x", "api")
	expect("", "/static/app.css", "static1 /app.css")
	expect("", "/other", "web1 /other")

	// A route added first takes /other to the pool static; the routes
	// that stay keep their hits.
	apiHits := n.Generation("http").Routes().Hits(0)
	code, body := postBody(t, adm+"/control/routes/http/add?at=0", "pool=static,path=/other")
	if code != 200 || !strings.Contains(body, "added pool=static,path=/other at 0") {
		t.Fatalf("add route: %d %q", code, body)
	}
	expect("", "/other", "static1 /other")
	if ev := eventsMatching(t, n, "http routes add by the operator"); len(ev) != 1 || !strings.Contains(ev[0], "pool=static,path=/other") {
		t.Errorf("events of the route change: %q", ev)
	}
	// Bad changes are refused and change nothing.
	for _, c := range []struct {
		path, body string
		code       int
	}{
		{"/control/routes/http/add", "pool=nope,path=/x", http.StatusConflict},
		{"/control/routes/http/add", "pool=api,colour=red", http.StatusBadRequest},
		{"/control/routes/http/add?at=9", "pool=api,path=/x", http.StatusBadRequest},
		{"/control/routes/http/7/remove", "", http.StatusNotFound},
		{"/control/routes/ftp/add", "pool=api", http.StatusBadRequest},
		{"/control/routes/sip/add", "pool=api", http.StatusConflict},
		{"/control/routes/http/add", strings.Repeat("a", 20<<10), http.StatusRequestEntityTooLarge},
	} {
		if code, body := postBody(t, adm+c.path, c.body); code != c.code {
			t.Errorf("POST %s %.40q: %d %q, want %d", c.path, c.body, code, body, c.code)
		}
	}
	if got := n.Generation("http").Routes().Len(); got != 3 {
		t.Errorf("%d routes after refused changes, want 3", got)
	}

	// GET /control/routes: the list in order with hits.
	var routes map[string][]admin.RouteStatus
	if err := json.Unmarshal([]byte(getBody(t, adm+"/control/routes")), &routes); err != nil {
		t.Fatal(err)
	}
	if r := routes["http"]; len(r) != 3 || r[0].Spec != "pool=static,path=/other" || r[0].Hits != 4 || r[1].Pool != "api" || r[1].Hits != apiHits || r[2].Spec != "pool=static,path=/static/,strip=/static" {
		t.Errorf("GET /control/routes: %+v (the new route counts from the route change on; api's keeps its %d hits)", r, apiHits)
	}

	// GET /control/config reads back to the same pools and routes.
	checkConfigReadsBack(t, getBody(t, adm+"/control/config"), n)

	// Draining the pool api drains its backends only.
	if code, body := post(t, adm+"/control/pools/api/drain", ""); code != 200 || !strings.Contains(body, "drained 2 backends: http api1, http api2") {
		t.Fatalf("drain pool: %d %q", code, body)
	}
	if code, _ := getHost(t, front, "api.example.com", "/v1"); code != http.StatusServiceUnavailable {
		t.Errorf("drained pool api answered %d, want 503", code)
	}
	expect("", "/other", "static1")
	expect("", "/", "web1")
	if code, _ := post(t, adm+"/control/pools/nope/drain", ""); code != http.StatusNotFound {
		t.Errorf("drain of an unknown pool: %d, want 404", code)
	}

	// A restart on the same data directory keeps the route list and the
	// drained pool.
	n.Stop(time.Second)
	n2, front2, adm2 := controlNode(t, cfg)
	if got := n2.routes["http"]; !slices.Equal(got, []string{"pool=static,path=/other", "pool=api,host=api.example.com", "pool=static,path=/static/,strip=/static"}) {
		t.Errorf("routes after a restart: %q", got)
	}
	front = front2
	expect("", "/other", "static1 /other")
	for _, id := range []string{"api1", "api2"} {
		if b := n2.Generation("http").Lookup(id); b == nil || !b.Drained() {
			t.Errorf("%s not drained after a restart", id)
		}
	}
	if b := n2.Generation("http").Lookup("web1"); b.Drained() {
		t.Error("web1 drained")
	}
	// Removing the route takes /other back to the pool default; with the
	// configured list back, the override is gone.
	if code, body := post(t, adm2+"/control/routes/http/0/remove", ""); code != 200 || !strings.Contains(body, "removed route 0 pool=static,path=/other") {
		t.Fatalf("remove route: %d %q", code, body)
	}
	expect("", "/other", "web1 /other")
	for _, o := range n2.store.Overrides() {
		if o.Key == "routes/http" {
			t.Errorf("override %q kept with the configured routes back", o.Value)
		}
	}
	if code, _ := post(t, adm2+"/control/pools/api/undrain", ""); code != 200 {
		t.Error("undrain pool refused")
	}
	expect("api.example.com", "/", "api")
}

func getBody(t *testing.T, u string) string {
	t.Helper()
	code, body, _ := get(t, u, "")
	if code != 200 {
		t.Fatalf("GET %s: %d %q", u, code, body)
	}
	return body
}

// checkConfigReadsBack parses the pools and routes of a printed running
// configuration and compares them with the ones in force.
func checkConfigReadsBack(t *testing.T, conf string, n *Node) {
	t.Helper()
	got := map[string][]string{}
	for _, line := range strings.Split(conf, "\n") {
		key, value, _ := strings.Cut(line, " ")
		switch key {
		case "http-pool", "sip-pool":
			p, err := lb.ParsePoolSpec(strings.TrimSuffix(key, "-pool"), value)
			if err != nil {
				t.Errorf("%q does not read back: %v", line, err)
			}
			got[key] = append(got[key], p.String())
		case "http-route", "sip-route":
			r, err := lb.ParseRouteSpec(strings.TrimSuffix(key, "-route"), value)
			if err != nil {
				t.Errorf("%q does not read back: %v", line, err)
			}
			got[key] = append(got[key], r.String())
		}
	}
	for _, proto := range []string{"http", "sip"} {
		var pools, routes []string
		for _, s := range n.specs(proto).Pools {
			p, _ := lb.ParsePoolSpec(proto, s)
			pools = append(pools, p.String())
		}
		for _, s := range n.specs(proto).Routes {
			r, _ := lb.ParseRouteSpec(proto, s)
			routes = append(routes, r.String())
		}
		if !slices.Equal(got[proto+"-pool"], pools) || !slices.Equal(got[proto+"-route"], routes) {
			t.Errorf("%s: config reads back to pools %q routes %q, in force %q %q", proto, got[proto+"-pool"], got[proto+"-route"], pools, routes)
		}
	}
	if len(got["http-route"]) == 0 || len(got["http-pool"]) == 0 {
		t.Errorf("no pools or routes printed:\n%s", conf)
	}
}

// TestSIPPoolsAndRoutes: the node builds the SIP front end's generation
// with its pools and routes, changes its routes at run time (the backends
// keep their state) and drains one pool only.
func TestSIPPoolsAndRoutes(t *testing.T) {
	cfg := testConfig(t)
	cfg.SIPBackends = []string{"127.0.0.1:5091,id=reg1", "127.0.0.1:5092,id=lon1,pool=london", "127.0.0.1:5093,id=lon2,pool=london"}
	cfg.SIPPools = []string{"name=london,policy=round-robin"}
	cfg.SIPRoutes = []string{"pool=london,domain=voice.example,user=+4420"}
	cfg.AdminListen = "127.0.0.1:0"
	n, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Stop(time.Second) })
	adm := "http://" + n.Addrs().Admin.String()
	g := n.Generation("sip")
	if g == nil || len(g.Pools()) != 2 || g.Pool("london").Len() != 2 || g.Routes().Len() != 1 {
		t.Fatalf("sip generation: %+v", g)
	}
	lon1 := g.Lookup("lon1")
	lon1.Disable(true)
	if code, body := postBody(t, adm+"/control/routes/sip/add", "pool=london,method=REGISTER"); code != 200 {
		t.Fatalf("add sip route: %d %q", code, body)
	}
	g2 := n.Generation("sip")
	if g2 == g || g2.Routes().Len() != 2 || g2.Routes().Spec(1).Method != "REGISTER" {
		t.Fatalf("sip routes after the change: %v", g2.Routes())
	}
	if !g2.Lookup("lon1").Disabled() {
		t.Error("a route change lost the operator's disable")
	}
	if code, body := post(t, adm+"/control/pools/london/drain?protocol=sip", ""); code != 200 || !strings.Contains(body, "drained 2 backends") {
		t.Fatalf("drain pool london: %d %q", code, body)
	}
	if g2.Lookup("reg1").Drained() || !g2.Lookup("lon2").Drained() {
		t.Error("drain of pool london: reg1 drained or lon2 not")
	}
	var st admin.Status
	if err := json.Unmarshal([]byte(getBody(t, adm+"/status")), &st); err != nil {
		t.Fatal(err)
	}
	var lon *admin.PoolStatus
	for i, p := range st.Pools {
		if p.Protocol == "sip" && p.Name == "london" {
			lon = &st.Pools[i]
		}
	}
	if lon == nil || lon.Policy != "round-robin" || !slices.Equal(lon.Backends, []string{"lon1", "lon2"}) || len(st.Routes["sip"]) != 2 || st.Routes["sip"][1].Pool != "london" {
		t.Errorf("/status pools %+v routes %+v", st.Pools, st.Routes)
	}
}

// TestARMPoolMustExist: an ARM rule whose pool= names no pool is refused
// at start (naming the flag and value), added or changed at run time, and
// in a reloaded -arm-file; one naming a pool is taken.
func TestARMPoolMustExist(t *testing.T) {
	cfg := testConfig(t)
	cfg.HTTPBackends = []string{poolBackend(t, "api1", "api"), poolBackend(t, "web1")}
	cfg.ARM = []string{"name=x,limit=10/s,pool=london"}
	_, err := New(cfg, nil)
	var ve *ValueError
	if !errors.As(err, &ve) || ve.Flag != "-arm" || ve.Value != "name=x,limit=10/s,pool=london" || !strings.Contains(err.Error(), "pool london is a pool of no front end (pools: api, default)") {
		t.Fatalf("start with an arm rule of no pool: %v", err)
	}
	cfg.ARM = []string{"name=x,limit=10/s,pool=api"}
	cfg.ARMFile = filepath.Join(t.TempDir(), "arm")
	os.WriteFile(cfg.ARMFile, []byte("name=y,limit=5/s\n"), 0o600)
	cfg.AdminListen = "127.0.0.1:0"
	n, _, adm := controlNode(t, cfg)
	if code, body := post(t, adm+"/control/arm/add", "name=z,limit=1/s,pool=nope"); code != http.StatusBadRequest || !strings.Contains(body, "pool nope is a pool of no front end") {
		t.Errorf("arm add of no pool: %d %q", code, body)
	}
	if code, body := post(t, adm+"/control/arm/x/set", "pool=nope"); code != http.StatusBadRequest {
		t.Errorf("arm set to no pool: %d %q", code, body)
	}
	if code, body := post(t, adm+"/control/arm/add", "name=z,limit=1/s,pool=default"); code != 200 {
		t.Errorf("arm add of pool default: %d %q", code, body)
	}
	os.WriteFile(cfg.ARMFile, []byte("name=y,limit=5/s,pool=gone\n"), 0o600)
	if err := n.ReloadARM(); err == nil || !strings.Contains(err.Error(), "rule y: pool gone is a pool of no front end") {
		t.Errorf("reload of an arm file naming no pool: %v", err)
	}
}

// TestReloadKeepsRouteChanges: a reload of -backends-file keeps the
// operator's route list while the file's routes stay as they were; once
// the file changes them, the file wins and the list is dropped with an
// event.
func TestReloadKeepsRouteChanges(t *testing.T) {
	cfg := testConfig(t)
	cfg.BackendsFile = filepath.Join(t.TempDir(), "backends")
	file := "http " + poolBackend(t, "web1") + "\nhttp " + poolBackend(t, "api1", "api") + "\nhttp-route pool=api,host=api.example.com\n"
	os.WriteFile(cfg.BackendsFile, []byte(file), 0o600)
	cfg.AdminListen = "127.0.0.1:0"
	n, front, adm := controlNode(t, cfg)
	if code, body := postBody(t, adm+"/control/routes/http/add", "pool=api,path=/v2/"); code != 200 {
		t.Fatalf("add route: %d %q", code, body)
	}
	if err := n.Reload(); err != nil {
		t.Fatal(err)
	}
	if got := n.Generation("http").Routes().Len(); got != 2 {
		t.Errorf("%d routes after a reload, want the operator's 2", got)
	}
	if _, body := getHost(t, front, "", "/v2/x"); !strings.HasPrefix(body, "api1") {
		t.Errorf("/v2/x after a reload reached %q", body)
	}
	os.WriteFile(cfg.BackendsFile, []byte(strings.Replace(file, "api.example.com", "api.example.org", 1)), 0o600)
	if err := n.Reload(); err != nil {
		t.Fatal(err)
	}
	if r := n.Generation("http").Routes(); r.Len() != 1 || r.Spec(0).Host != "api.example.org" {
		t.Errorf("routes after the file changed them: %d", r.Len())
	}
	if ev := eventsMatching(t, n, "run-time change routes/http="); len(ev) != 1 || !strings.Contains(ev[0], "dropped") {
		t.Errorf("events: %q", ev)
	}
}

// TestSIPDisabledKeptAcrossReloadWithPingsOff: a SIP backend an operator
// disabled stays disabled across a reload of -backends-file, and once
// enabled it is up: with pings off no probe verdict came back with it to
// hold it down for good.
func TestSIPDisabledKeptAcrossReloadWithPingsOff(t *testing.T) {
	cfg := testConfig(t)
	cfg.BackendsFile = filepath.Join(t.TempDir(), "backends")
	os.WriteFile(cfg.BackendsFile, []byte("sip 127.0.0.1:5091,id=as1\nsip 127.0.0.1:5092,id=as2\n"), 0o600)
	cfg.AdminListen = "127.0.0.1:0"
	n, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Stop(time.Second) })
	adm := "http://" + n.Addrs().Admin.String()
	if code, body := post(t, adm+"/control/backends/as1/disable", ""); code != 200 {
		t.Fatalf("disable: %d %q", code, body)
	}
	os.WriteFile(cfg.BackendsFile, []byte("sip 127.0.0.1:5091,id=as1\nsip 127.0.0.1:5092,id=as2\nsip 127.0.0.1:5093,id=as3\n"), 0o600)
	if err := n.Reload(); err != nil {
		t.Fatal(err)
	}
	g := n.Generation("sip")
	if b := g.Lookup("as1"); b == nil || !b.Disabled() || g.Lookup("as3") == nil {
		t.Fatalf("after the reload: as1 %v, as3 %v", b, g.Lookup("as3"))
	}
	if code, body := post(t, adm+"/control/backends/as1/enable", ""); code != 200 {
		t.Fatalf("enable: %d %q", code, body)
	}
	if st := g.Lookup("as1").State(n.clock.Now()); st != lb.Up {
		t.Errorf("as1 enabled after the reload is %v, want up", st)
	}
}

// TestStickySessionKeepsPoolAcrossRouteChange: a client whose sticky
// cookie names a backend of the pool a route sent it to keeps that
// backend after the route is removed through the control API, while new
// clients follow the new routes.
func TestStickySessionKeepsPoolAcrossRouteChange(t *testing.T) {
	cfg := testConfig(t)
	cfg.HTTPBackends = []string{poolBackend(t, "web1"), poolBackend(t, "shop1", "shop")}
	cfg.HTTPRoutes = []string{"pool=shop,path=/cart"}
	cfg.AdminListen = "127.0.0.1:0"
	_, front, adm := controlNode(t, cfg)
	code, body, cookie := get(t, front+"/cart", "")
	if code != 200 || !strings.HasPrefix(body, "shop1") || cookie == "" {
		t.Fatalf("first /cart: %d %q cookie %q", code, body, cookie)
	}
	if code, body := post(t, adm+"/control/routes/http/0/remove", ""); code != 200 {
		t.Fatalf("remove route: %d %q", code, body)
	}
	if _, body, _ := get(t, front+"/cart", ""); !strings.HasPrefix(body, "web1") {
		t.Errorf("new client after the route change reached %q, want web1", body)
	}
	for range 3 {
		if _, body, _ := get(t, front+"/cart", cookie); !strings.HasPrefix(body, "shop1") {
			t.Errorf("sticky client after the route change reached %q, want shop1", body)
		}
	}
}
