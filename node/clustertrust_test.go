package node

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"

	"github.com/sluicelb/sluice/cluster"
)

// TestClusterDialogsSignedWithKeyRing: two nodes share the SIP dialog
// table only when they share the affinity key file. With the same file,
// node B applies the change node A makes when it sends an INVITE to a
// backend; with a key file of its own, B rejects A's changes (counted)
// and applies none.
func TestClusterDialogsSignedWithKeyRing(t *testing.T) {
	for _, tc := range []struct {
		name    string
		sameKey bool
	}{{"same key file", true}, {"another key file", false}} {
		t.Run(tc.name, func(t *testing.T) {
			mr := miniredis.RunT(t)
			backend, err := net.ListenPacket("udp", "127.0.0.1:0") // takes the INVITE, never answers
			if err != nil {
				t.Fatal(err)
			}
			defer backend.Close()
			dir := t.TempDir()
			var nodes []*Node
			for i := range 2 {
				cfg := testConfig(t)
				cfg.SIPBackends = []string{backend.LocalAddr().String() + ",id=s1"}
				cfg.KeyFile = filepath.Join(dir, "key")
				if !tc.sameKey {
					cfg.KeyFile = filepath.Join(dir, fmt.Sprint("key", i))
				}
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
			a, b := nodes[0], nodes[1]
			waitFor(t, 3*time.Second, "both nodes to see two members", func() bool {
				return a.cluster.Nodes() == 2 && b.cluster.Nodes() == 2
			})
			client, err := net.Dial("udp", a.Addrs().SIP.String())
			if err != nil {
				t.Fatal(err)
			}
			defer client.Close()
			// Subscriptions are asynchronous: send INVITEs (new dialogs) until
			// B has applied or rejected one.
			seen := func() bool { st := b.cluster.Dialogs(); return st.Applied+st.Rejected > 0 }
			for i := 0; !seen(); i++ {
				if i == 250 {
					t.Fatalf("B saw no dialog change of A's within 5s: A %+v, B %+v", a.cluster.Dialogs(), b.cluster.Dialogs())
				}
				fmt.Fprintf(client, "INVITE sip:bob@example.com SIP/2.0\r\nVia: SIP/2.0/UDP %s;branch=z9hG4bK-%d\r\nMax-Forwards: 70\r\n"+
					"From: <sip:alice@example.com>;tag=a%d\r\nTo: <sip:bob@example.com>\r\nCall-ID: trust-%d\r\nCSeq: 1 INVITE\r\n"+
					"Contact: <sip:alice@%s>\r\nContent-Length: 0\r\n\r\n", client.LocalAddr(), i, i, i, client.LocalAddr())
				time.Sleep(20 * time.Millisecond)
			}
			st := b.cluster.Dialogs()
			if tc.sameKey && (st.Applied == 0 || st.Rejected != 0) {
				t.Errorf("same key file: B %+v, want changes applied and none rejected", st)
			}
			if !tc.sameKey && (st.Applied != 0 || st.Rejected == 0 || b.cluster.Rejected()["dialog_signature"] == 0) {
				t.Errorf("another key file: B %+v %v, want none applied and signatures rejected", st, b.cluster.Rejected())
			}
		})
	}
}

// TestClusterWithoutKeyFileWarns: a node of a cluster started without
// -affinity-key-file says that the other nodes must hold the same key.
func TestClusterWithoutKeyFileWarns(t *testing.T) {
	mr := miniredis.RunT(t)
	for _, keyFile := range []string{"", filepath.Join(t.TempDir(), "key")} {
		var buf bytes.Buffer
		cfg := testConfig(t)
		cfg.KeyFile = keyFile
		cfg.SIPBackends = []string{"127.0.0.1:1,id=s1"}
		cfg.Cluster = cluster.Config{Redis: "redis://" + mr.Addr() + "/0", Name: "t", Node: "n0"}
		n, err := New(cfg, slog.New(slog.NewTextHandler(&buf, nil)))
		if err != nil {
			t.Fatal(err)
		}
		n.Stop(time.Second)
		if warned := strings.Contains(buf.String(), "cluster without -affinity-key-file"); warned != (keyFile == "") {
			t.Errorf("key file %q: warned %v:\n%s", keyFile, warned, buf.String())
		}
	}
}
