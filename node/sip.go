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

// sipProbesFor builds the memory probes of the SIP backends in pool that
// have a metrics URL in bcs. Each probe feeds the pool's own lb.Backend,
// whose MOP the front end consults.
func (n *Node) sipProbesFor(pool *lb.Pool, bcs []lbsip.BackendConfig) ([]*lb.MemoryProbe, error) {
	urls := map[string]string{}
	for _, bc := range bcs {
		if bc.MetricsURL != "" {
			urls[sipID(bc)] = bc.MetricsURL
		}
	}
	var probes []*lb.MemoryProbe
	for _, b := range pool.Backends() {
		u, ok := urls[b.ID()]
		if !ok || b.MOP() == nil {
			continue
		}
		pc := n.cfg.MOPProbe
		pc.URL = u
		probe, err := lb.NewMemoryProbe(b, pc, n.clock, n.logger)
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
	var mopErr error
	if err := n.sipSrv.SetBackends(bcs, n.sipMOPHook(&mopErr)); err != nil {
		return err
	}
	if mopErr != nil {
		return mopErr
	}
	n.sipBackends = specs
	// The probe settings and URLs were checked at start and by the
	// parser: building the probes of the new set does not fail.
	probes, err := n.sipProbesFor(n.sipSrv.Pool(), bcs)
	if err != nil {
		return err
	}
	n.startSIPProbes(probes)
	return nil
}

// sipConfig is the SIP front end's Config with specs parsed as its
// backends. A listen address defaults to DefaultSIPConfig's once there is
// a backend.
func sipConfig(c lbsip.Config, specs []string) (lbsip.Config, error) {
	if c.Listen == "" {
		c.Listen = DefaultSIPConfig().Listen
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
