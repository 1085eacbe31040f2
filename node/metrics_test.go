package node

import (
	"bytes"
	"errors"
	"net/http/httptest"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/sluicelb/sluice/admin"
	"github.com/sluicelb/sluice/admission"
	lbhttp "github.com/sluicelb/sluice/http"
	"github.com/sluicelb/sluice/internal/testenv"
	"github.com/sluicelb/sluice/lb"
	lbsip "github.com/sluicelb/sluice/sip"
)

// oddNames are backend ids and rule names an operator can write that the
// exposition format must escape: quotes, backslashes, line breaks, control
// characters, non-ASCII.
var oddNames = []string{`b"1`, `back\slash`, "new\nline", "ctl\x01char", "tab\there", "ünïcødé", "{x=\"y\"}"}

// scrape builds the /metrics handler of a node with an HTTP and a SIP
// front end, some counts and the odd names, and returns what it serves.
func scrape(t *testing.T) []byte {
	t.Helper()
	rules := []admission.RuleConfig{
		{Name: "invites", Match: admission.Match{Proto: "sip", Method: "INVITE"}, Limit: 1, Unit: time.Minute, Action: admission.ActionReject},
	}
	for _, n := range oddNames {
		rules = append(rules, admission.RuleConfig{Name: n, Match: admission.Match{PathPrefix: "/odd/"}, Limit: 5, Unit: time.Second, Action: admission.ActionLog})
	}
	ctrl, err := admission.NewController(admission.ControllerConfig{Rules: rules}, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	invite := &admission.Request{Proto: "sip", Method: "INVITE"}
	ctrl.Decide(0, invite, nil)
	ctrl.Decide(1, invite, nil) // refused by the rule
	ctrl.Decide(2, &admission.Request{Proto: "http", Class: admission.Affinity}, nil)
	mop, _ := admission.NewMOP(admission.MOPConfig{Name: "b1"})
	mop.Observe(0, 400, 1000)
	failing, _ := admission.NewMOP(admission.MOPConfig{Name: "b2"})
	failing.ProbeFailed(errors.New("status 302"))
	hist := newForwardHistogram()
	hist.WithLabelValues("http").Observe(0.002)
	var hs lbhttp.Stats
	hs.HandedOver.Add(3)
	hs.UpstreamError.Add(2)
	signer, err := lb.NewSigner(bytes.Repeat([]byte{7}, 32))
	if err != nil {
		t.Fatal(err)
	}
	sipSrv, err := lbsip.New(lbsip.Config{Backends: []lbsip.BackendConfig{{ID: oddNames[0], Addr: "127.0.0.1:1"}}},
		lbsip.Deps{Admission: ctrl, Signer: signer}, nil)
	if err != nil {
		t.Fatal(err)
	}
	sipSrv.Metrics().Requests.Add(7)
	sipSrv.Metrics().Aborted.Add(1)
	h, err := metricsHandler(metricsSources{
		ctrl: ctrl,
		backends: func() []admin.BackendStatus {
			out := []admin.BackendStatus{{ID: "b1", Protocol: "http", State: "draining", MOP: admin.FromMOP(mop), Pools: []string{"default"}},
				{ID: "b2", Protocol: "http", State: "up", MOP: admin.FromMOP(failing), Pools: []string{"default"}},
				{ID: "b3", Protocol: "http", State: "up", Outstanding: 4, Pools: []string{"api", "web"}}}
			for _, n := range oddNames {
				out = append(out, admin.BackendStatus{ID: n, Protocol: "sip", State: "up", Outstanding: 2, MOP: admin.FromMOP(mop)})
			}
			return out
		},
		forward: hist,
		fronts:  []prometheus.Collector{lbhttp.NewCollector(&hs), sipSrv.Collector()},
	})
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if rec.Code != 200 {
		t.Fatalf("/metrics: %d %s", rec.Code, rec.Body)
	}
	return rec.Body.Bytes()
}

func TestMetricsExposition(t *testing.T) {
	raw := scrape(t)
	body := string(raw)
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(bytes.NewReader(raw))
	if err != nil {
		t.Fatalf("exposition does not parse: %v\n%s", err, body)
	}
	for _, name := range []string{"sluice_requests_admitted_total", "sluice_requests_refused_total", "sluice_arm_rate",
		"sluice_arm_limit", "sluice_arm_queued", "sluice_mop_allowed_rate", "sluice_mop_learned_rate", "sluice_backend_memory_ratio",
		"sluice_backend_state", "sluice_forward_duration_seconds", "sluice_frontend_events_total", "sluice_frontend_transactions",
		"go_goroutines", "process_resident_memory_bytes"} {
		if families[name] == nil {
			t.Errorf("missing family %s", name)
		}
	}
	for _, line := range []string{
		`sluice_requests_admitted_total{class="new",protocol="sip"} 1`,
		`sluice_requests_admitted_total{class="affinity",protocol="http"} 1`,
		`sluice_requests_refused_total{protocol="sip",reason="arm"} 1`,
		`sluice_arm_limit{rule="invites",unit="minute"} 1`,
		`sluice_backend_state{backend="b1",pool="default",protocol="http",state="draining"} 1`,
		`sluice_mop_allowed_rate{backend="b1",pool="default",protocol="http"} 10`,
		`sluice_forward_duration_seconds_count{protocol="http"} 1`,
		`sluice_frontend_events_total{event="handed_over",protocol="http"} 3`,
		`sluice_frontend_events_total{event="upstream_error",protocol="http"} 2`,
		`sluice_frontend_events_total{event="aborted",protocol="http"} 0`,
		`sluice_frontend_events_total{event="aborted",protocol="sip"} 1`,
		`sluice_frontend_events_total{event="requests",protocol="sip"} 7`,
		`sluice_frontend_events_total{event="refused_no_backend",protocol="sip"} 0`,
		`sluice_frontend_transactions{protocol="sip"} 0`,
		`sluice_backend_memory_ratio{backend="b1",pool="default",protocol="http"} 0.4`,
		`sluice_mop_probe_failures_total{backend="b2",pool="default",protocol="http"} 1`,
		// A backend in two pools: one series, both pools named.
		`sluice_backend_outstanding{backend="b3",pool="api,web",protocol="http"} 4`,
	} {
		if !strings.Contains(body, line) {
			t.Errorf("missing %q", line)
		}
	}
	if strings.Contains(body, `sluice_backend_memory_ratio{backend="b2"`) {
		t.Error("a backend whose memory probe fails has a memory ratio")
	}
	// The front ends' route and pool families are named per protocol
	// (their labels differ: HTTP's pool refusals and SIP's new work per
	// backend), and so are HTTP's tunnels (upgraded connections, which
	// only HTTP has); every other family has a protocol label.
	routeFamilies := regexp.MustCompile(`sluice_(http|sip)_(route_hits_total|no_route_total|pool_refused_total|pool_new_work_total)\b|sluice_http_tunnels(_total|_refused_total)?\b`)
	if rest := routeFamilies.ReplaceAllString(body, ""); strings.Contains(rest, "sluice_sip_") || strings.Contains(rest, "sluice_http_") {
		t.Errorf("per-protocol family names left:\n%s", rest)
	}
}

// TestMetricsOddNames: backend ids and rule names with quotes,
// backslashes, line breaks, control characters and non-ASCII come back
// from the exposition exactly as given, and promtool accepts it.
func TestMetricsOddNames(t *testing.T) {
	raw := scrape(t)
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(bytes.NewReader(raw))
	if err != nil {
		t.Fatalf("exposition does not parse: %v\n%s", err, raw)
	}
	labelValues := func(family, label string) map[string]bool {
		out := map[string]bool{}
		if f := families[family]; f != nil {
			for _, m := range f.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == label {
						out[l.GetValue()] = true
					}
				}
			}
		}
		return out
	}
	backends, rules := labelValues("sluice_backend_outstanding", "backend"), labelValues("sluice_arm_rate", "rule")
	for _, n := range oddNames {
		if !backends[n] {
			t.Errorf("backend %q not in sluice_backend_outstanding: %v", n, backends)
		}
		if !rules[n] {
			t.Errorf("rule %q not in sluice_arm_rate: %v", n, rules)
		}
	}

	promtool := testenv.Tool(t, "promtool", "prometheus")
	cmd := exec.Command(promtool, "check", "metrics")
	cmd.Stdin = bytes.NewReader(raw)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Errorf("promtool check metrics: %v\n%s", err, out)
	}
}
