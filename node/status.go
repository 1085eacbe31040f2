package node

import (
	"github.com/sluicelb/sluice/admin"
	"github.com/sluicelb/sluice/lb"
)

// poolStatus lists the pools of both front ends for /status: each with
// its policy, its panic and its members' ids.
func (n *Node) poolStatus() []admin.PoolStatus {
	var out []admin.PoolStatus
	for _, proto := range []string{"http", "sip"} {
		g := n.Generation(proto)
		var pools []*lb.Pool
		if g != nil {
			pools = g.Pools()
		} else if p := n.frontPool(proto); p != nil {
			pools = []*lb.Pool{p}
		}
		for _, p := range pools {
			ps := admin.PoolStatus{Protocol: proto, Name: p.Name(), Panic: p.Panicking(), Backends: []string{}}
			if g != nil {
				spec, _ := g.PoolSpec(p.Name())
				ps.Policy = spec.Policy
			} else if proto == "sip" {
				ps.Policy = n.cfg.SIP.Policy
			} else {
				ps.Policy = n.cfg.Policy
			}
			if ps.Name == "" {
				ps.Name = lb.DefaultPool
			}
			for _, b := range p.Backends() {
				ps.Backends = append(ps.Backends, b.ID())
			}
			out = append(out, ps)
		}
	}
	return out
}

// routeStatus lists the routes in force by protocol, with their hits.
func (n *Node) routeStatus() map[string][]admin.RouteStatus {
	out := map[string][]admin.RouteStatus{}
	for _, proto := range []string{"http", "sip"} {
		if n.frontPool(proto) == nil {
			continue
		}
		rs := []admin.RouteStatus{}
		if g := n.Generation(proto); g != nil {
			if t := g.Routes(); t != nil {
				for i := range t.Len() {
					spec := t.Spec(i)
					rs = append(rs, admin.RouteStatus{Spec: spec.String(), Pool: spec.Pool, Hits: t.Hits(i)})
				}
			}
		}
		out[proto] = rs
	}
	return out
}

// httpTunnels is the HTTP front end's tunnels for /status, nil without
// one.
func (n *Node) httpTunnels() any {
	if n.httpSrv == nil {
		return nil
	}
	return n.httpSrv.TunnelStatus()
}

// sipStatus is /status's sip: nil (left out) without a SIP front end.
func (n *Node) sipStatus() any {
	if n.sipSrv == nil {
		return nil
	}
	return n.sipSrv.Status()
}
