package main

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sluicelb/sluice/admin"
)

// TestCtlRoutesAndPools: sluice ctl route list|add|remove, drain-pool and
// undrain-pool against a running sluice with two pools; status groups the
// backends by pool and lists the routes with their hits; the running
// configuration reads back to the same pools and routes.
func TestCtlRoutesAndPools(t *testing.T) {
	var specs []string
	for _, b := range []struct{ id, pool string }{{"web1", ""}, {"api1", "api"}, {"api2", "api"}} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, b.id) }))
		t.Cleanup(srv.Close)
		spec := srv.Listener.Addr().String() + ",id=" + b.id
		if b.pool != "" {
			spec += ",pool=" + b.pool
		}
		specs = append(specs, spec)
	}
	args := []string{"-http-listen", "127.0.0.1:0", "-admin-listen", "127.0.0.1:0", "-data-dir", t.TempDir(), "-health-interval", "0",
		"-http-backend", specs[0], "-http-backend", specs[1], "-http-backend", specs[2],
		"-http-pool", "name=api,policy=least-outstanding,health=/healthz", "-http-route", "pool=api,host=api.example.com"}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready := make(chan [2]net.Addr, 1)
	exit := make(chan int, 1)
	var stderr syncBuffer
	go func() {
		exit <- run(ctx, args, io.Discard, &stderr, &runHooks{ready: func(h, a net.Addr) { ready <- [2]net.Addr{h, a} }})
	}()
	var addrs [2]net.Addr
	select {
	case addrs = <-ready:
	case code := <-exit:
		t.Fatalf("run exited %d: %s", code, stderr.String())
	}
	adm := addrs[1].String()
	front := "http://" + addrs[0].String()
	hit := func(host string) string {
		req, _ := http.NewRequest("GET", front+"/", nil)
		req.Host = host
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	if got := hit("api.example.com"); !strings.HasPrefix(got, "api") {
		t.Fatalf("api.example.com reached %q", got)
	}

	for _, tc := range []struct {
		args []string
		code int
		out  string
	}{
		{[]string{"route", "list"}, 0, "0      http   api   1     pool=api,host=api.example.com"},
		{[]string{"route", "add", "http", "pool=api,path=/v2/", "0"}, 0, "http routes: added pool=api,path=/v2/ at 0 (2 routes)"},
		{[]string{"route", "add", "http", "pool=nope,path=/x"}, 1, "pool nope has no http backends"},
		{[]string{"route", "add", "ftp", "pool=api"}, 2, `protocol "ftp": want http or sip`},
		{[]string{"route", "add", "http"}, 2, "route add PROTO SPEC [AT]"},
		{[]string{"route", "remove", "http", "5"}, 1, "no such route"},
		{[]string{"drain-pool", "api"}, 0, "drained 2 backends: http api1, http api2"},
		{[]string{"drain-pool", "nope"}, 1, "no such pool"},
		{[]string{"drain-pool"}, 2, "drain-pool NAME"},
	} {
		code, out, errOut := ctl(append([]string{"-admin", adm}, tc.args...)...)
		got := out
		if tc.code != 0 {
			got = errOut
		}
		if code != tc.code || !strings.Contains(got, tc.out) {
			t.Errorf("sluice ctl %s = %d\nstdout %q\nstderr %q\nwant %d with %q", strings.Join(tc.args, " "), code, out, errOut, tc.code, tc.out)
		}
	}
	if got := hit(""); got != "web1" {
		t.Errorf("with pool api drained, the pool default answered %q", got)
	}
	code, out, _ := ctl("-admin", adm, "status")
	for _, want := range []string{"POOL", "http default  web1", "http api      api1", "http api      api2", "draining",
		"ROUTE  PROTO  POOL  HITS  SPEC", "0      http   api   0     pool=api,path=/v2/", "1      http   api   1     pool=api,host=api.example.com"} { // a route that stays keeps its hits
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("sluice ctl status lacks %q:\n%s", want, out)
		}
	}
	var st admin.Status
	resp, err := http.Get("http://" + adm + "/status")
	if err != nil {
		t.Fatal(err)
	}
	json.NewDecoder(resp.Body).Decode(&st)
	resp.Body.Close()
	if len(st.Pools) != 2 || st.Pools[1].Name != "api" || st.Pools[1].Policy != "least-outstanding" || !slices.Equal(st.Pools[1].Backends, []string{"api1", "api2"}) {
		t.Errorf("/status pools: %+v", st.Pools)
	}
	if code, out, _ := ctl("-admin", adm, "undrain-pool", "api"); code != 0 || !strings.Contains(out, "undrained 2 backends") {
		t.Errorf("undrain-pool: %d %q", code, out)
	}
	if code, out, _ := ctl("-admin", adm, "route", "remove", "http", "0"); code != 0 || !strings.Contains(out, "removed route 0 pool=api,path=/v2/") {
		t.Errorf("route remove: %d %q", code, out)
	}

	// The running configuration reads back to the same pools and routes.
	code, conf, _ := ctl("-admin", adm, "config")
	if code != 0 {
		t.Fatal("config refused")
	}
	file := filepath.Join(t.TempDir(), "running.conf")
	os.WriteFile(file, []byte(conf), 0o600)
	fs := newFlagSet("run", io.Discard)
	o := newRunFlags(fs)
	if err := readConfigFile(fs, file, nil); err != nil {
		t.Fatalf("-config of the running configuration: %v\n%s", err, conf)
	}
	if !slices.Equal(o.httpPools.values, []string{"name=api,policy=least-outstanding,health=/healthz"}) ||
		!slices.Equal(o.httpRoutes.values, []string{"pool=api,host=api.example.com"}) || len(o.httpBackends.values) != 3 {
		t.Errorf("read back: pools %q routes %q backends %q\n%s", o.httpPools.values, o.httpRoutes.values, o.httpBackends.values, conf)
	}
}
