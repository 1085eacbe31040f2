package main

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
func (p *plan) sipMOPHook(o *runOptions, errp *error) func(lbsip.BackendConfig) *admission.MOP {
	return func(bc lbsip.BackendConfig) *admission.MOP {
		if bc.MetricsURL == "" || *errp != nil {
			return nil
		}
		m, err := p.newMOP(o, "sip", sipID(bc), bc.Addr)
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
func (p *plan) sipProbesFor(o *runOptions, bcs []lbsip.BackendConfig) ([]*lb.MemoryProbe, error) {
	var probes []*lb.MemoryProbe
	for _, bc := range bcs {
		if bc.MetricsURL == "" {
			continue
		}
		m, err := p.newMOP(o, "sip", sipID(bc), bc.Addr)
		if err != nil {
			return nil, err
		}
		shadow, err := lb.NewBackend(lb.BackendConfig{ID: sipID(bc), Addr: bc.Addr, Proto: "sip", MOP: m})
		if err != nil {
			return nil, err
		}
		pc := o.mopProbe
		pc.URL = bc.MetricsURL
		probe, err := lb.NewMemoryProbe(shadow, pc, p.clock, p.logger)
		if err != nil {
			return nil, err
		}
		probes = append(probes, probe)
	}
	return probes, nil
}

// startSIPProbes runs probes until the plan stops or the next reload, and
// stops the ones that ran before.
func (p *plan) startSIPProbes(probes []*lb.MemoryProbe) {
	if p.sipProbeCancel != nil {
		p.sipProbeCancel()
	}
	ctx, cancel := context.WithCancel(p.ctx)
	p.sipProbeCancel = cancel
	for _, probe := range probes {
		p.goBackground(func() { probe.Run(ctx) })
	}
}

// reloadSIP puts a new list of SIP backends in force (see
// sip.Server.SetBackends): those that stay keep their learned rates and
// their dialogs; removed ones take no new work while calls on them end.
func (p *plan) reloadSIP(o *runOptions, specs []string) error {
	var bcs []lbsip.BackendConfig
	for _, s := range specs {
		bc, err := lbsip.ParseBackend(s)
		if err != nil {
			return err
		}
		bcs = append(bcs, bc)
	}
	probes, err := p.sipProbesFor(o, bcs)
	if err != nil {
		return err
	}
	var mopErr error
	if err := p.sipSrv.SetBackends(bcs, p.sipMOPHook(o, &mopErr)); err != nil {
		return err
	}
	p.startSIPProbes(probes)
	o.sip.backends = specs
	return mopErr
}
