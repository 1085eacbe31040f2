package node

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"

	"github.com/sluicelb/sluice/cluster"
)

// TestTwoNodesShareARMLimit: two nodes on one Redis share a 20/min rule
// (a unit long enough that the test's seconds fit in one window): together
// they admit 20, each refuses the rest, and /status/cluster shows both
// members and the rule on leased budgets.
func TestTwoNodesShareARMLimit(t *testing.T) {
	mr := miniredis.RunT(t)
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "ok") }))
	defer be.Close()
	var nodes []*Node
	for i := range 2 {
		cfg := testConfig(t)
		cfg.HTTPBackends = []string{be.Listener.Addr().String() + ",id=b1"}
		cfg.AdminListen = "127.0.0.1:0"
		cfg.ARM = []string{"name=all,proto=http,limit=20/min,action=reject"}
		cfg.Cluster = cluster.Config{Redis: "redis://" + mr.Addr() + "/0", Name: "t", Node: fmt.Sprintf("n%d", i)}
		n, err := New(cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := n.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		defer n.Stop(time.Second)
		nodes = append(nodes, n)
	}
	waitFor(t, 3*time.Second, "both nodes to see two members", func() bool {
		return nodes[0].cluster.Nodes() == 2 && nodes[1].cluster.Nodes() == 2
	})
	ok := 0
	for range 30 {
		for _, n := range nodes {
			resp, err := http.Get("http://" + n.Addrs().HTTP.String() + "/")
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 {
				ok++
			}
		}
	}
	if ok != 20 {
		t.Errorf("two nodes admitted %d of 60 under a shared 20/min rule, want 20", ok)
	}
	resp, err := http.Get("http://" + nodes[0].Addrs().Admin.String() + "/status/cluster")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st cluster.Status
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	if st.Redis != "up" || st.Nodes != 2 || len(st.Rules) != 1 || st.Rules[0].Mode != "shared" {
		t.Errorf("/status/cluster: %+v", st)
	}
}

// TestRestartDuringRedisOutageKeepsShare: a node that last saw three
// members and restarts while Redis is away divides its limit by three
// (the fail policy local), not by one: the count is kept in the data
// directory.
func TestRestartDuringRedisOutageKeepsShare(t *testing.T) {
	mr := miniredis.RunT(t)
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "ok") }))
	defer be.Close()
	var cfgs []Config
	var nodes []*Node
	for i := range 3 {
		cfg := testConfig(t)
		cfg.HTTPBackends = []string{be.Listener.Addr().String() + ",id=b1"}
		cfg.ARM = []string{"name=all,proto=http,limit=30/min,action=reject"}
		cfg.Cluster = cluster.Config{Redis: "redis://" + mr.Addr() + "/0", Name: "t", Node: fmt.Sprintf("n%d", i), Heartbeat: 50 * time.Millisecond}
		n, err := New(cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := n.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		cfgs, nodes = append(cfgs, cfg), append(nodes, n)
	}
	waitFor(t, 5*time.Second, "node 0 to save a count of three", func() bool { return nodes[0].store.ClusterNodes() == 3 })
	for _, n := range nodes {
		n.Stop(time.Second)
	}
	mr.Close() // Redis away for the restart

	n, err := New(cfgs[0], nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer n.Stop(time.Second)
	ok := 0
	for range 30 {
		resp, err := http.Get("http://" + n.Addrs().HTTP.String() + "/")
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode == 200 {
			ok++
		}
	}
	if ok != 10 {
		t.Errorf("restarted with Redis away: admitted %d of 30 under a 30/min rule last shared by 3 nodes, want 10", ok)
	}
}

// TestClusterConfigMistakeStopsStartup: a Redis that refuses the
// configuration (a wrong password) stops start-up with a message naming
// the flag; an unreachable one does not (the fail policy applies).
func TestClusterConfigMistakeStopsStartup(t *testing.T) {
	mr := miniredis.RunT(t)
	mr.RequireAuth("right")
	cfg := testConfig(t)
	cfg.HTTPBackends = []string{"127.0.0.1:9,id=b1"}
	cfg.Cluster = cluster.Config{Redis: "redis://:wrong@" + mr.Addr() + "/0", Name: "t", Node: "n0"}
	if _, err := New(cfg, nil); err == nil || !strings.Contains(err.Error(), "refused the configuration") {
		t.Fatalf("wrong password: %v, want an error saying Redis refused the configuration", err)
	}
	addr := mr.Addr()
	mr.Close()
	cfg.Cluster.Redis = "redis://" + addr + "/0"
	n, err := New(cfg, nil)
	if err != nil {
		t.Fatalf("Redis away at start: %v, want the node to start under its fail policy", err)
	}
	if n == nil {
		t.Fatal("no node")
	}
}
