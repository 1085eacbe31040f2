package node

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicelb/sluice/admission"
	"github.com/sluicelb/sluice/persist"
)

// controlNode starts a node with HTTP backends b1 and b2 (each answers its
// name) and an admin listener; it is stopped when the test ends unless
// the test stops it first.
func controlNode(t *testing.T, cfg Config) (*Node, string, string) {
	t.Helper()
	n, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Stop(time.Second) })
	a := n.Addrs()
	return n, "http://" + a.HTTP.String(), "http://" + a.Admin.String()
}

func twoBackends(t *testing.T) []string {
	var specs []string
	for _, name := range []string{"b1", "b2"} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, name) }))
		t.Cleanup(srv.Close)
		specs = append(specs, srv.Listener.Addr().String()+",id="+name)
	}
	return specs
}

func get(t *testing.T, u string, cookie string) (int, string, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", u, nil)
	if cookie != "" {
		req.Header.Set("Cookie", cookie)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), strings.SplitN(resp.Header.Get("Set-Cookie"), ";", 2)[0]
}

func post(t *testing.T, u, value string) (int, string) {
	t.Helper()
	resp, err := http.PostForm(u, url.Values{"value": {value}})
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// TestDrainAvoidsNewWorkKeepsAffinity: a drained backend gets no new work
// while its sticky clients still reach it.
func TestDrainAvoidsNewWorkKeepsAffinity(t *testing.T) {
	cfg := testConfig(t)
	cfg.HTTPBackends = twoBackends(t)
	cfg.AdminListen = "127.0.0.1:0"
	_, front, adm := controlNode(t, cfg)
	var cookie string
	for range 4 {
		if _, body, c := get(t, front+"/", ""); body == "b1" {
			cookie = c
			break
		}
	}
	if cookie == "" {
		t.Fatal("no request went to b1")
	}
	if code, body := post(t, adm+"/control/backends/b1/drain", ""); code != 200 {
		t.Fatalf("drain: %d %s", code, body)
	}
	for i := range 10 {
		if _, body, _ := get(t, front+"/", ""); body != "b2" {
			t.Fatalf("new request %d after drain went to %q", i, body)
		}
		if code, body, _ := get(t, front+"/", cookie); code != 200 || body != "b1" {
			t.Fatalf("sticky request %d after drain: %d %q, want b1", i, code, body)
		}
	}
	if code, _ := post(t, adm+"/control/backends/b1/disable", ""); code != 200 {
		t.Fatal("disable refused")
	}
	if _, body, _ := get(t, front+"/", cookie); body != "b2" {
		t.Errorf("sticky request to a disabled backend went to %q, want re-pinned to b2", body)
	}
	if code, _, _ := get(t, adm+"/control/backends/b1/drain", ""); code != 405 {
		t.Errorf("GET of a control path: %d, want 405", code)
	}
}

// TestARMChangeTakesEffectOnNextDecision: raising a rule's limit through
// the admin listener admits the very next request.
func TestARMChangeTakesEffectOnNextDecision(t *testing.T) {
	cfg := testConfig(t)
	cfg.HTTPBackends = twoBackends(t)[:1]
	cfg.AdminListen = "127.0.0.1:0"
	cfg.ARM = []string{"name=api,proto=http,limit=2/min,action=reject"}
	_, front, adm := controlNode(t, cfg)
	for i, want := range []int{200, 200, 429} {
		if code, _, _ := get(t, front+"/", ""); code != want {
			t.Fatalf("request %d: %d, want %d", i, code, want)
		}
	}
	if code, body := post(t, adm+"/control/arm/api/set", "limit=3/min"); code != 200 {
		t.Fatalf("arm set: %d %s", code, body)
	}
	if code, _, _ := get(t, front+"/", ""); code != 200 {
		t.Errorf("next request after raising the limit: %d", code)
	}
	if code, _, _ := get(t, front+"/", ""); code != 429 {
		t.Errorf("over the new limit: %d", code)
	}
	if code, body := post(t, adm+"/control/arm/api/remove", ""); code != 200 {
		t.Fatalf("arm remove: %d %s", code, body)
	}
	if code, _, _ := get(t, front+"/", ""); code != 200 {
		t.Errorf("after removing the rule: %d", code)
	}
}

// TestOverridesSurviveRestartUnlessConfigChanged: changes are kept in the
// data directory and applied at the next start; a flag changed since wins
// and drops its override with an event.
func TestOverridesSurviveRestartUnlessConfigChanged(t *testing.T) {
	cfg := testConfig(t)
	backends := twoBackends(t)
	cfg.HTTPBackends = backends
	cfg.AdminListen = "127.0.0.1:0"
	cfg.ARM = []string{"name=api,proto=http,limit=2/min,action=reject", "name=keep,path=/k/,limit=9/min"}
	n, _, adm := controlNode(t, cfg)
	for _, c := range []struct{ path, value string }{
		{"/control/backends/b1/weight", "5"},
		{"/control/backends/b2/drain", ""},
		{"/control/arm/api/set", "limit=50/min"},
		{"/control/arm/add", "name=extra,path=/x/,limit=1/s"},
		{"/control/arm/keep/remove", ""},
	} {
		if code, body := post(t, adm+c.path, c.value); code != 200 {
			t.Fatalf("%s: %d %s", c.path, code, body)
		}
	}
	n.Stop(time.Second)

	// Same configuration: every change is back.
	n2, _, adm2 := controlNode(t, cfg)
	_, conf, _ := get(t, adm2+"/control/config", "")
	for _, want := range []string{"arm name=api,proto=http,limit=50/min,action=reject", "arm name=extra,path=/x/,limit=1/s", ",id=b1,weight=5", "# http backend b2: drained"} {
		if !strings.Contains(conf, want) {
			t.Errorf("after a restart the running configuration lacks %q:\n%s", want, conf)
		}
	}
	if strings.Contains(conf, "name=keep") {
		t.Errorf("the removed rule came back:\n%s", conf)
	}
	n2.Stop(time.Second)

	// The flags changed since: b1's weight and api's rule come from them.
	cfg.HTTPBackends = []string{backends[0] + ",weight=2", backends[1]}
	cfg.ARM = []string{"name=api,proto=http,limit=7/min,action=reject", "name=keep,path=/k/,limit=9/min"}
	n3, _, adm3 := controlNode(t, cfg)
	_, conf, _ = get(t, adm3+"/control/config", "")
	for _, want := range []string{"limit=7/min", ",id=b1,weight=2", "# http backend b2: drained", "name=extra"} {
		if !strings.Contains(conf, want) {
			t.Errorf("with changed flags the running configuration lacks %q:\n%s", want, conf)
		}
	}
	if strings.Contains(conf, "name=keep") {
		t.Errorf("the rule removed at run time came back though its flag did not change:\n%s", conf)
	}
	n3.store.Flush()
	evs, _ := n3.store.Tail(100)
	var dropped []string
	for _, e := range evs {
		if strings.Contains(e.Message, "dropped: the configuration changed since") {
			dropped = append(dropped, e.Subject)
		}
	}
	if strings.Join(dropped, " ") != "arm/api backend/http/b1/weight" {
		t.Errorf("drop events for %v, want arm/api and b1's weight", dropped)
	}
	var keys []string
	for _, o := range n3.store.Overrides() {
		keys = append(keys, o.Key)
	}
	if strings.Join(keys, " ") != "arm/extra arm/keep backend/http/b2/drain" {
		t.Errorf("overrides kept %v", keys)
	}
	// Undoing a change removes its override.
	if code, _ := post(t, adm3+"/control/backends/b2/undrain", ""); code != 200 {
		t.Fatal("undrain refused")
	}
	for _, o := range n3.store.Overrides() {
		if o.Key == "backend/http/b2/drain" {
			t.Errorf("undrain back to the configured state kept %+v", o)
		}
	}
}

// TestAdminTokens: a node with a token file answers 401/403 without the
// right token and names the token in the event log; off loopback without
// one it does not start.
func TestAdminTokens(t *testing.T) {
	cfg := testConfig(t)
	cfg.HTTPBackends = twoBackends(t)[:1]
	cfg.AdminListen = "0.0.0.0:0"
	if _, err := New(cfg, nil); err == nil || !strings.Contains(err.Error(), "-admin-token-file") || !strings.Contains(err.Error(), "-admin-listen") {
		t.Fatalf("non-loopback admin without tokens: %v", err)
	}
	cfg.AdminListen = "127.0.0.1:0"
	cfg.AdminTokenFile = filepath.Join(t.TempDir(), "tokens")
	os.WriteFile(cfg.AdminTokenFile, []byte("ops 0123456789abcdef0123\n"), 0o600)
	n, _, adm := controlNode(t, cfg)
	if code, _ := post(t, adm+"/control/backends/b1/drain", ""); code != 401 {
		t.Errorf("without a token: %d", code)
	}
	req, _ := http.NewRequest("POST", adm+"/control/backends/b1/drain", nil)
	req.Header.Set("Authorization", "Bearer 0123456789abcdef0123")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("with the token: %d", resp.StatusCode)
	}
	n.store.Flush()
	evs, _ := n.store.Tail(20)
	found := false
	for _, e := range evs {
		found = found || strings.Contains(e.Message, "token ops")
	}
	if !found {
		t.Errorf("no event names the token: %+v", evs)
	}
	var ov []persist.Override = n.store.Overrides()
	if len(ov) != 1 || !strings.Contains(ov[0].By, "token ops") {
		t.Errorf("override does not say who: %+v", ov)
	}
}

// eventsMatching returns the messages of the events in n's log that hold
// substr.
func eventsMatching(t *testing.T, n *Node, substr string) []string {
	t.Helper()
	n.store.Flush()
	evs, err := n.store.Tail(200)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range evs {
		if strings.Contains(e.Message, substr) {
			out = append(out, e.Message)
		}
	}
	return out
}

// TestBackendsReloadKeepsRunTimeChanges: a reload of -backends-file keeps
// a drained backend drained from the first request on (its sticky clients
// still reach it); an override of a setting the file changed is dropped
// with an event, the file's value wins.
func TestBackendsReloadKeepsRunTimeChanges(t *testing.T) {
	cfg := testConfig(t)
	backends := twoBackends(t)
	cfg.BackendsFile = filepath.Join(t.TempDir(), "backends")
	writeBackends := func(lines ...string) {
		t.Helper()
		if err := os.WriteFile(cfg.BackendsFile, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	writeBackends("http "+backends[0], "http "+backends[1])
	cfg.AdminListen = "127.0.0.1:0"
	n, front, adm := controlNode(t, cfg)
	var cookie string
	for range 4 {
		if _, body, c := get(t, front+"/", ""); body == "b1" {
			cookie = c
		}
	}
	for _, c := range [][2]string{{"/control/backends/b1/drain", ""}, {"/control/backends/b2/weight", "3"}} {
		if code, body := post(t, adm+c[0], c[1]); code != 200 {
			t.Fatalf("%s: %d %s", c[0], code, body)
		}
	}
	writeBackends("http "+backends[0], "http "+backends[1]+",weight=2")
	if err := n.Reload(); err != nil {
		t.Fatal(err)
	}
	pool := n.httpSrv.Pool()
	if b1 := pool.Lookup("b1"); b1 == nil || !b1.Drained() {
		t.Fatalf("b1 after the reload: %+v, want drained", b1)
	}
	if w := pool.Lookup("b2").Weight(); w != 2 {
		t.Errorf("b2's weight after the file changed it: %d, want 2 (the file wins)", w)
	}
	for i := range 6 {
		if _, body, _ := get(t, front+"/", ""); body != "b2" {
			t.Fatalf("new request %d after the reload went to %q", i, body)
		}
	}
	if _, body, _ := get(t, front+"/", cookie); body != "b1" {
		t.Errorf("sticky request after the reload went to %q, want b1", body)
	}
	if got := eventsMatching(t, n, "backend/http/b2/weight"); len(got) != 1 || !strings.Contains(got[0], `from "1" to "2"`) {
		t.Errorf("drop events for b2's weight: %q", got)
	}
}

// TestARMReloadKeepsOverrides: SIGHUP's reload of -arm-file leaves a rule
// changed at run time as the operator set it while the file's line for it
// is unchanged, and lets the file win (dropping the override, with an
// event) once the line changed.
func TestARMReloadKeepsOverrides(t *testing.T) {
	cfg := testConfig(t)
	cfg.HTTPBackends = twoBackends(t)[:1]
	cfg.ARMFile = filepath.Join(t.TempDir(), "arm.rules")
	writeRules := func(lines ...string) {
		t.Helper()
		if err := os.WriteFile(cfg.ARMFile, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	writeRules("name=api,proto=http,limit=2/min,action=reject", "name=gone,path=/g/,limit=1/s")
	cfg.AdminListen = "127.0.0.1:0"
	n, _, adm := controlNode(t, cfg)
	for _, c := range [][2]string{{"/control/arm/api/set", "limit=50/min"}, {"/control/arm/gone/remove", ""}} {
		if code, body := post(t, adm+c[0], c[1]); code != 200 {
			t.Fatalf("%s: %d %s", c[0], code, body)
		}
	}
	rules := func() string {
		var s []string
		for _, rc := range n.ctrl.RuleConfigs() {
			_, limit, _ := strings.Cut(admission.FormatRule(rc), "limit=")
			limit, _, _ = strings.Cut(limit, ",")
			s = append(s, rc.Name+":"+limit)
		}
		return strings.Join(s, " ")
	}
	writeRules("name=api,proto=http,limit=2/min,action=reject", "name=gone,path=/g/,limit=1/s", "name=more,path=/m/,limit=3/s")
	if err := n.ReloadARM(); err != nil {
		t.Fatal(err)
	}
	if got := rules(); got != "api:50/min more:3/s" {
		t.Errorf("rules after a reload that left api and gone alone: %s", got)
	}
	if got := eventsMatching(t, n, "arm rules reloaded"); len(got) != 1 || !strings.Contains(got[0], "(more added)") {
		t.Errorf("reload events %q, want one naming only the added rule", got)
	}
	writeRules("name=api,proto=http,limit=7/min,action=reject", "name=gone,path=/g/,limit=1/s", "name=more,path=/m/,limit=3/s")
	if err := n.ReloadARM(); err != nil {
		t.Fatal(err)
	}
	if got := rules(); got != "api:7/min more:3/s" {
		t.Errorf("rules after the file changed api: %s", got)
	}
	if got := eventsMatching(t, n, "dropped: the configuration changed since"); len(got) != 1 || !strings.Contains(got[0], "arm/api") {
		t.Errorf("drop events %q, want one for arm/api", got)
	}
	var keys []string
	for _, o := range n.store.Overrides() {
		keys = append(keys, o.Key)
	}
	if strings.Join(keys, " ") != "arm/gone" {
		t.Errorf("overrides kept %v, want arm/gone", keys)
	}
}

// TestAdminHostsWired: the node's admin listener answers 421 to a Host it
// was not given, serves the names of -admin-host (AdminHosts), and counts
// the refusals in /metrics.
func TestAdminHostsWired(t *testing.T) {
	cfg := testConfig(t)
	cfg.HTTPBackends = twoBackends(t)[:1]
	cfg.AdminListen = "127.0.0.1:0"
	cfg.AdminHosts = []string{"sluice.example"}
	_, _, adm := controlNode(t, cfg)
	get := func(path, host string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest("GET", adm+path, nil)
		req.Host = host
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, _ := get("/metrics", "rebind.evil.example"); code != http.StatusMisdirectedRequest {
		t.Errorf("/metrics for Host rebind.evil.example: %d, want 421", code)
	}
	if code, _ := get("/status", "sluice.example"); code != 200 {
		t.Errorf("/status for the -admin-host name: %d, want 200", code)
	}
	if code, body := get("/metrics", strings.TrimPrefix(adm, "http://")); code != 200 || !strings.Contains(body, "sluice_admin_misdirected_total 1\n") {
		t.Errorf("/metrics: %d, want 200 with sluice_admin_misdirected_total 1", code)
	}
	bad := testConfig(t)
	bad.HTTPBackends, bad.AdminListen, bad.AdminHosts = cfg.HTTPBackends, "127.0.0.1:0", []string{"http://x/"}
	if _, err := New(bad, nil); err == nil || !strings.Contains(err.Error(), "-admin-host") {
		t.Errorf("AdminHosts http://x/: %v, want an error naming -admin-host", err)
	}
}
