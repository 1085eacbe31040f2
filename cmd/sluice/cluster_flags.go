package main

import (
	"flag"

	"github.com/sluicelb/sluice/cluster"
)

// clusterFlags registers the flags of cluster.Config on fs (sluice run).
// The fail policy is parsed when the flags are read, so a bad value stops
// start-up naming -cluster-fail.
func clusterFlags(fs *flag.FlagSet, cfg *cluster.Config) {
	d := cluster.DefaultConfig()
	*cfg = d
	fs.StringVar(&cfg.Redis, "cluster-redis", "", "join a cluster of nodes sharing ARM limits, MOP learning and the SIP dialog table through Redis: redis://[user:pass@]host:port/db, rediss:// (TLS), ?master_name=M&addr=... (Sentinel) or redis+cluster:// (empty: standalone); every client of that Redis can change the cluster's budgets: give the cluster a Redis user of its own (ACL) and TLS")
	fs.StringVar(&cfg.Name, "cluster-name", d.Name, "cluster name: nodes with the same Redis and name share budgets")
	fs.StringVar(&cfg.Node, "cluster-node", "", "this node's name among the members (default: host name and process id)")
	fs.Func("cluster-fail", "while Redis is unreachable: local (each node enforces limit ÷ last known node count), open (each node the full limit) or closed (rules refuse what they match) (default local)", func(s string) error {
		p, err := cluster.ParseFailPolicy(s)
		cfg.Fail = p
		return err
	})
	fs.DurationVar(&cfg.Wait, "cluster-wait", d.Wait, "longest a decision waits for a lease round trip when its node has no leased token left (at most 10ms)")
	fs.DurationVar(&cfg.Timeout, "cluster-timeout", d.Timeout, "timeout of a Redis round trip of the background leasers; two failures in a row apply -cluster-fail")
	fs.DurationVar(&cfg.Heartbeat, "cluster-heartbeat", d.Heartbeat, "membership heartbeat period; a node is counted for three periods after its last")
	fs.IntVar(&cfg.DialogMax, "cluster-dialog-max", d.DialogMax, "most SIP dialog table entries other nodes' changes may fill on this node (64 bytes each); past it their new dialogs are not applied (counted)")
}
