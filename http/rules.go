package http

import (
	"fmt"

	"github.com/sluicelb/sluice/admission"
)

// ruleView is what the front end derives from one ARM rule set: whether
// any rule matches on the path (so requests need their path parsed) and
// the Proxy-Status value of each rule's refusals. The controller's rule
// set changes at run time (the admin listener, SIGHUP): the view follows
// it, so a path rule added later matches HTTP requests from the next one.
type ruleView struct {
	meters   []*admission.Meter // the rule set the view was built from
	needPath bool               // a rule matches on the path
	armPS    [][]byte           // Proxy-Status value per rule, by index
}

func newRuleView(meters []*admission.Meter) *ruleView {
	v := &ruleView{meters: meters, armPS: make([][]byte, len(meters))}
	for i, m := range meters {
		v.needPath = v.needPath || m.Config().Match.PathPrefix != ""
		v.armPS[i] = fmt.Appendf(nil, "sluice; error=http_request_denied; details=%q", "arm rule "+m.Name())
	}
	return v
}

// sameMeters reports whether a and b are the same rule set: the
// controller stores every new set in a new slice, so the first element's
// address and the length identify it.
func sameMeters(a, b []*admission.Meter) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}

// rules returns the view of the rule set in force: two atomic loads and a
// comparison per request, a rebuild only after the set changed.
func (s *Server) rules() *ruleView {
	meters := s.ctrl.Rules()
	if v := s.ruleView.Load(); v != nil && sameMeters(v.meters, meters) {
		return v
	}
	v := newRuleView(meters)
	s.ruleView.Store(v)
	return v
}
