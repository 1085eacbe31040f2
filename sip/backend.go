package sip

import (
	"fmt"
	"net/netip"
	"time"

	"github.com/sluicelb/sluice/admission"
	"github.com/sluicelb/sluice/lb"
)

// backend is an lb.Backend plus what SIP needs to reach it: a resolved
// address and a transport. Read-only after construction.
type backend struct {
	lb   *lb.Backend
	id   string
	addr netip.AddrPort
	tcp  bool
	cfg  BackendConfig
}

// transport returns "TCP" or "UDP" for Via.
func (b *backend) transport() string {
	if b.tcp {
		return "TCP"
	}
	return "UDP"
}

// drain keeps new work away from b for d after a 503 (RFC 3261 §21.5.4);
// affinity traffic continues.
func (b *backend) drain(now int64, d time.Duration) {
	b.lb.SetBusy(now + int64(d))
}

// pool is the lb.Pool of SIP backends with address lookups.
type pool struct {
	lb     *lb.Pool
	list   []*backend // by lb index
	byID   map[string]*backend
	byAddr map[netip.AddrPort]*backend
}

func newPool(cfgs []BackendConfig, policy string, mops func(BackendConfig) *admission.MOP) (*pool, error) {
	switch policy {
	case "hash":
		policy = "consistent-hash"
	}
	p := &pool{byID: map[string]*backend{}, byAddr: map[netip.AddrPort]*backend{}}
	var lbs []*lb.Backend
	for _, c := range cfgs {
		ap, err := resolveAddr(c.Addr)
		if err != nil {
			return nil, fmt.Errorf("-sip-backend %s: %w", c.Addr, err)
		}
		ap = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
		var mop *admission.MOP
		if mops != nil {
			mop = mops(c)
		}
		lbb, err := lb.NewBackend(lb.BackendConfig{ID: c.ID, Addr: ap.String(), Proto: "sip", Weight: c.Weight, MOP: mop})
		if err != nil {
			return nil, fmt.Errorf("-sip-backend %s: %w", c.Addr, err)
		}
		b := &backend{lb: lbb, id: c.ID, addr: ap, tcp: c.Transport == "tcp", cfg: c}
		lbs = append(lbs, lbb)
		p.list = append(p.list, b)
		p.byID[b.id] = b
		p.byAddr[ap] = b
	}
	lp, err := lb.NewPool(lb.PoolConfig{Policy: policy}, lbs)
	if err != nil {
		return nil, fmt.Errorf("-sip-lb-policy: %w", err)
	}
	p.lb = lp
	return p, nil
}

// pick returns the backend for new work with key at now that is not in
// tried and whose MOP admits the request, adding every candidate it looks
// at to tried (so a failover never comes back to one). It is lb.Pool.Pick
// with a set of backends to skip instead of one. It allocates nothing.
func (p *pool) pick(key uint64, now int64, tried *lb.Set) (*backend, lb.Outcome, time.Duration) {
	out := lb.NoBackend
	var retry time.Duration
	for {
		i := p.lb.Policy().Select(p.lb.Backends(), now, key, *tried)
		if i < 0 {
			return nil, out, retry
		}
		tried.Add(i)
		c := p.lb.Backends()[i]
		if c.MOP().Allow(now) {
			return p.list[i], lb.Picked, 0
		}
		if ra := c.MOP().RetryAfter(now); out != lb.MOPRefused || ra < retry {
			retry = ra
		}
		out = lb.MOPRefused
	}
}

// home returns the backend the policy gives key, ignoring MOP: the
// fallback for in-dialog requests that carry no token. It is never nil. Only the hash
// policy makes this the backend of the dialog's INVITE.
func (p *pool) home(key uint64, now int64) *backend {
	i := p.lb.Policy().Select(p.lb.Backends(), now, key, lb.Set{})
	if i < 0 {
		// Nothing takes new work (all down or draining): in-dialog
		// requests still go somewhere fixed rather than being refused.
		return p.list[key%uint64(len(p.list))]
	}
	return p.list[i]
}
