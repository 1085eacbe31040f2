package node

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
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
