package main

import (
	"flag"

	"github.com/sluicelb/sluice/cluster"
)

// clusterFlags registers the flags of cluster.Config on fs (sluice run),
// recording in fields the field each sets.
// The fail policy is parsed when the flags are read, so a bad value stops
// start-up naming -cluster-fail.
func clusterFlags(fs *flag.FlagSet, fields map[string]string, cfg *cluster.Config) {
	*cfg = cluster.DefaultConfig()
	sec := newSection(fs, fields, "cluster", "", cfg)
	sec.add(&cfg.Redis, "cluster-redis", "join a cluster of nodes sharing ARM limits, MOP learning and the SIP dialog table through Redis: redis://[user:pass@]host:port/db, rediss:// (TLS), ?master_name=M&addr=... (Sentinel) or redis+cluster:// (empty: standalone); every client of that Redis can change the cluster's budgets: give the cluster a Redis user of its own (ACL) and TLS")
	sec.add(&cfg.Name, "cluster-name", "cluster name: nodes with the same Redis and name share budgets")
	sec.add(&cfg.Node, "cluster-node", "this node's name among the members (default: host name and process id)")
	sec.fn(&cfg.Fail, "cluster-fail", "while Redis is unreachable: local (each node enforces limit ÷ last known node count), open (each node the full limit) or closed (rules refuse what they match) (default "+cfg.Fail.String()+")", func(s string) error {
		p, err := cluster.ParseFailPolicy(s)
		cfg.Fail = p
		return err
	})
	sec.add(&cfg.Wait, "cluster-wait", "longest a decision waits for a lease round trip when its node has no leased token left (at most 10ms)")
	sec.add(&cfg.Timeout, "cluster-timeout", "timeout of a Redis round trip of the background leasers; two failures in a row apply -cluster-fail")
	sec.add(&cfg.Heartbeat, "cluster-heartbeat", "membership heartbeat period; a node is counted for three periods after its last")
	sec.add(&cfg.DialogMax, "cluster-dialog-max", "most SIP dialog table entries other nodes' changes may fill on this node (64 bytes each); past it their new dialogs are not applied (counted)")
}
