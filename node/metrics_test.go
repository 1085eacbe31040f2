package node

import (
	"bytes"
	"fmt"
	"io"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/sluicelb/sluice/admin"
	"github.com/sluicelb/sluice/admission"
	lbhttp "github.com/sluicelb/sluice/http"
)

func TestMetricsExposition(t *testing.T) {
	ctrl, err := admission.NewController(admission.ControllerConfig{Rules: []admission.RuleConfig{
		{Name: "invites", Match: admission.Match{Proto: "sip", Method: "INVITE"}, Limit: 1, Unit: time.Minute, Action: admission.ActionReject},
	}}, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	invite := &admission.Request{Proto: "sip", Method: "INVITE"}
	ctrl.Decide(0, invite, nil)
	ctrl.Decide(1, invite, nil) // refused by the rule
	ctrl.Decide(2, &admission.Request{Proto: "http", Class: admission.Affinity}, nil)
	mop, _ := admission.NewMOP(admission.MOPConfig{Name: "b1"})
	hist := newForwardHistogram()
	hist.WithLabelValues("http").Observe(0.002)
	var hs lbhttp.Stats
	hs.HandedOver.Add(3)
	hs.UpstreamError.Add(2)
	h, err := metricsHandler(metricsSources{
		http: &hs,
		ctrl: ctrl,
		backends: func() []admin.BackendStatus {
			return []admin.BackendStatus{{ID: "b1", Protocol: "http", State: "draining", MOP: admin.FromMOP(mop)}}
		},
		extra:   []func(io.Writer){func(w io.Writer) { fmt.Fprintln(w, "sluice_sip_requests_total 7") }},
		forward: hist,
	})
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body := rec.Body.String()
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(bytes.NewReader(rec.Body.Bytes()))
	if err != nil {
		t.Fatalf("exposition does not parse: %v\n%s", err, body)
	}
	for _, name := range []string{"sluice_requests_admitted_total", "sluice_requests_refused_total", "sluice_arm_rate",
		"sluice_arm_limit", "sluice_arm_queued", "sluice_mop_allowed_rate", "sluice_mop_learned_rate", "sluice_backend_memory_ratio",
		"sluice_backend_state", "sluice_forward_duration_seconds", "sluice_sip_requests_total", "go_goroutines"} {
		if families[name] == nil {
			t.Errorf("missing family %s", name)
		}
	}
	for _, line := range []string{
		`sluice_requests_admitted_total{class="new",protocol="sip"} 1`,
		`sluice_requests_admitted_total{class="affinity",protocol="http"} 1`,
		`sluice_requests_refused_total{protocol="sip",reason="arm"} 1`,
		`sluice_arm_limit{rule="invites",unit="minute"} 1`,
		`sluice_backend_state{backend="b1",protocol="http",state="draining"} 1`,
		`sluice_mop_allowed_rate{backend="b1",protocol="http"} 10`,
		`sluice_forward_duration_seconds_count{protocol="http"} 1`,
		`sluice_http_events_total{event="handed_over"} 3`,
		`sluice_http_events_total{event="upstream_error"} 2`,
		`sluice_http_events_total{event="aborted"} 0`,
	} {
		if !strings.Contains(body, line) {
			t.Errorf("missing %q", line)
		}
	}
}
