package node

import (
	"github.com/sluicelb/sluice/lb"
	lbsip "github.com/sluicelb/sluice/sip"
)

// The SIP front end serves a generation the node builds the same way as
// HTTP's (buildGen), with the server's OPTIONS check as its prober. The
// pings leave from the server's socket: a generation is started once the
// server has started (Start), and on a reload or route change once it is
// in force.

// sipGenConfig sets the SIP settings of a generation's configuration:
// -sip-lb-policy, the -sip-health-* pings with the server's prober, and
// passive ejection (-health-max-fails, -health-cooldown): new work that a
// backend leaves unanswered (no provisional before the failover timer),
// refused connections and 5xx answers other than 503 (which drains it by
// its Retry-After) count against it, so a silent backend stops taking the
// first try of every call after a few of them, probes or not. The
// server's own watch of unanswered in-dialog requests ejects too.
func (n *Node) sipGenConfig(gc *lb.GenConfig) error {
	c := n.cfg.SIP
	gc.Passive = n.cfg.Passive
	gc.Passive.OnEject = n.onEject("sip")
	gc.Policy = c.Policy
	if gc.Policy == "" {
		gc.Policy = DefaultSIPConfig().Policy
	}
	if c.HealthInterval > 0 {
		gc.Health = lb.HealthConfig{Interval: c.HealthInterval, Timeout: c.HealthTimeout, Rise: c.HealthRise, Fall: c.HealthFall, Panic: n.cfg.Health.Panic}
		gc.Prober = n.sipSrv.Prober
	}
	return nil
}

// sipGeneration is the SIP front end's generation in force.
func (n *Node) sipGeneration() *lb.Generation {
	if n.sipSrv == nil {
		return nil
	}
	return n.sipSrv.Generation()
}

// installSIP hands gen to the SIP front end, starts it when the server
// runs, and stops the generation it replaces. The caller holds op.mu, or
// the node is not started yet.
func (n *Node) installSIP(gen *lb.Generation) error {
	if err := n.sipSrv.SetGeneration(gen); err != nil {
		gen.Stop()
		return err
	}
	if n.ctx != nil && n.sipStarted {
		gen.Start(n.ctx)
	}
	old := n.sipGen
	n.sipGen = gen
	if old != nil {
		old.Stop()
	}
	return nil
}

// reloadSIP puts a new set of SIP backends, pools and routes in force:
// backends that stay keep their state, learned rates and dialogs; removed
// ones take no new work while calls on them end.
func (n *Node) reloadSIP(set specSet) error {
	gen, err := n.buildGen("sip", set, n.sipGen)
	if err != nil {
		return err
	}
	return n.installSIP(gen)
}

// sipConfig is the SIP front end's Config without backends (the node
// hands it a generation). A listen address defaults to
// DefaultSIPConfig's once there is a backend.
func sipConfig(c lbsip.Config) lbsip.Config {
	if c.Listen == "" {
		c.Listen = DefaultSIPConfig().Listen
	}
	c.Backends = nil
	return c
}
