// Package cluster makes several sluice nodes behave as one balancer by
// sharing budgets through Redis.
//
// Without it a node is standalone. With it, each ARM rule's six sub-interval
// counters live in one Redis hash, and a node leases slices of the remaining
// budget with an atomic script (lease.lua) whose clock is Redis TIME, so node
// clocks do not matter. Decisions spend leased tokens through the admission
// package's lock-free meter (admission.Lease) and never wait on the network
// beyond a small budget; a leaser goroutine per rule asks for tokens ahead of
// need and returns unspent ones at the end of the shared sub-interval they
// were counted in. A token is spendable only inside that sub-interval, and
// every grant is counted before it is spent, so no six consecutive
// sub-intervals admit more than the limit across the cluster.
//
// Membership is a sorted set of heartbeats with expiry (the node count sizes
// leases and the local fail share). When Redis is unreachable the fail policy
// applies: local (limit ÷ last known node count on each node), open (each
// node applies the full limit) or closed (rules refuse what they match); the
// node rejoins on its own when Redis answers again.
package cluster
