package node

import (
	"context"

	"github.com/sluicelb/sluice/admission"
	"github.com/sluicelb/sluice/lb"
	lbsip "github.com/sluicelb/sluice/sip"
)

func sipID(bc lbsip.BackendConfig) string {
	if bc.ID != "" {
		return bc.ID
	}
	return bc.Addr
}

// sipMOPHook gives the SIP front end each backend's MOP limiter: a new one,
// or the one a backend with the same address already had, so that what it
// learned survives a reload. Backends without a memory probe get none. The
// first error lands in *errp.
func (n *Node) sipMOPHook(errp *error) func(lbsip.BackendConfig) *admission.MOP {
	return func(bc lbsip.BackendConfig) *admission.MOP {
		if bc.MetricsURL == "" || *errp != nil {
			return nil
		}
		m, err := n.newMOP("sip", sipID(bc), bc.Addr)
		if err != nil {
			*errp = err
			return nil
		}
		return m
	}
}

// sipProbesFor builds the memory probes of the SIP backends that have a
// metrics URL. A probe feeds the backend's MOP through a stand-in
// lb.Backend: it only reads the backend's id and limiter.
func (n *Node) sipProbesFor(bcs []lbsip.BackendConfig) ([]*lb.MemoryProbe, error) {
	var probes []*lb.MemoryProbe
	for _, bc := range bcs {
		if bc.MetricsURL == "" {
			continue
		}
		m, err := n.newMOP("sip", sipID(bc), bc.Addr)
		if err != nil {
			return nil, err
		}
		shadow, err := lb.NewBackend(lb.BackendConfig{ID: sipID(bc), Addr: bc.Addr, Proto: "sip", MOP: m})
		if err != nil {
			return nil, err
		}
		pc := n.cfg.MOPProbe
		pc.URL = bc.MetricsURL
		probe, err := lb.NewMemoryProbe(shadow, pc, n.clock, n.logger)
		if err != nil {
			return nil, err
		}
		probes = append(probes, probe)
	}
	return probes, nil
}

// startSIPProbes runs probes until the plan stops or the next reload, and
// stops the ones that ran before.
func (n *Node) startSIPProbes(probes []*lb.MemoryProbe) {
	if n.sipProbeCancel != nil {
		n.sipProbeCancel()
	}
	ctx, cancel := context.WithCancel(n.ctx)
	n.sipProbeCancel = cancel
	for _, probe := range probes {
		n.goBackground(func() { probe.Run(ctx) })
	}
}

// reloadSIP puts a new list of SIP backends in force (see
// sip.Server.SetBackends): those that stay keep their learned rates and
// their dialogs; removed ones take no new work while calls on them end.
func (n *Node) reloadSIP(specs []string) error {
	var bcs []lbsip.BackendConfig
	for _, s := range specs {
		bc, err := lbsip.ParseBackend(s)
		if err != nil {
			return err
		}
		bcs = append(bcs, bc)
	}
	probes, err := n.sipProbesFor(bcs)
	if err != nil {
		return err
	}
	var mopErr error
	if err := n.sipSrv.SetBackends(bcs, n.sipMOPHook(&mopErr)); err != nil {
		return err
	}
	n.startSIPProbes(probes)
	n.sipBackends = specs
	return mopErr
}

// sipConfig is the SIP front end's Config with specs parsed as its
// backends. A listen address defaults to :5060 once there is a backend.
func sipConfig(c lbsip.Config, specs []string) (lbsip.Config, error) {
	if c.Listen == "" {
		c.Listen = ":5060"
	}
	c.Backends = nil
	for _, s := range specs {
		b, err := lbsip.ParseBackend(s)
		if err != nil {
			return c, err
		}
		c.Backends = append(c.Backends, b)
	}
	return c, nil
}
