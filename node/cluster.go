package node

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/sluicelb/sluice/cluster"
	lbsip "github.com/sluicelb/sluice/sip"
)

// newCluster joins the cluster of cfg.Cluster when -cluster-redis is given:
// ARM rules spend leased budgets from now on (the fail policy applies until
// Redis first answers). Backends' MOPs are attached as they are built
// (newMOP) and the SIP dialog table once the node runs (startCluster).
func (n *Node) newCluster() error {
	if err := n.cfg.Cluster.Validate(); err != nil {
		return err
	}
	if !n.cfg.Cluster.Enabled() {
		return nil
	}
	d := cluster.DefaultConfig()
	timeout := n.cfg.Cluster.Timeout
	if timeout == 0 {
		timeout = d.Timeout
	}
	rdb, err := cluster.NewClient(n.cfg.Cluster.Redis, timeout)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*timeout)
	err = cluster.CheckReachable(ctx, rdb)
	cancel()
	if err != nil {
		rdb.Close()
		return err
	}
	if n.cluster, err = cluster.New(n.cfg.Cluster, rdb, n.clock, n.events, n.logger); err != nil {
		rdb.Close()
		return err
	}
	n.cluster.AttachRules(n.ctrl.Rules())
	return nil
}

// startCluster runs the membership and leasers, and shares the SIP dialog
// table, until ctx ends.
func (n *Node) startCluster(ctx context.Context) {
	if n.cluster == nil {
		return
	}
	if n.store != nil {
		if last := n.store.ClusterNodes(); last > 1 {
			n.cluster.SetLastNodes(last)
		}
		n.goBackground(func() { n.keepClusterNodes(ctx) })
	}
	n.goBackground(func() { n.cluster.Run(ctx) })
	if n.sipSrv != nil {
		srv := n.sipSrv
		max := n.cluster.DialogMax()
		publish, err := n.cluster.ShareDialogs(ctx, n.keyRing, func(b []byte) error {
			var ev lbsip.DialogEvent
			if err := json.Unmarshal(b, &ev); err != nil {
				return fmt.Errorf("%w: %w", cluster.ErrDialogInvalid, err)
			}
			if !srv.ApplyRemoteDialog(ev, max) {
				return cluster.ErrDialogCap
			}
			return nil
		})
		if err != nil {
			n.logger.Error("SIP dialog table not shared", "err", err)
		} else {
			srv.SetDialogShare(func(ev lbsip.DialogEvent) {
				if b, err := json.Marshal(ev); err == nil {
					publish(b)
				}
			})
		}
	}
	if n.admin != nil {
		n.admin.Handle("GET /status/cluster", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			json.NewEncoder(w).Encode(n.cluster.Status())
		}))
	}
}

// keepClusterNodes saves the cluster's node count in the data directory
// whenever it changes while Redis answers, so that a restart during a
// Redis outage divides limits by it (see cluster.SetLastNodes).
func (n *Node) keepClusterNodes(ctx context.Context) {
	every := n.cfg.Cluster.Heartbeat
	if every <= 0 {
		every = cluster.DefaultConfig().Heartbeat
	}
	t := time.NewTicker(every)
	defer t.Stop()
	saved := n.store.ClusterNodes()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !n.cluster.Up() {
			continue
		}
		if v := n.cluster.Nodes(); v != saved {
			if err := n.store.SetClusterNodes(v); err == nil {
				saved = v
			}
		}
	}
}
