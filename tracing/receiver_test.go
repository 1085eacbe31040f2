package tracing

import (
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// receiver is an OTLP/HTTP collector for tests: it decodes the real
// protobuf ExportTraceServiceRequest messages posted to /v1/traces and
// keeps their spans. With hold set, each request waits until hold is
// closed (a collector that does not answer).
type receiver struct {
	srv      *httptest.Server
	mu       sync.Mutex
	spans    []*tracepb.Span
	resource map[string]string
	paths    []string
	ctype    string
	hold     chan struct{}
	arrived  chan struct{} // one value per request, when it arrives (buffered)
}

func newReceiver(t *testing.T) *receiver {
	r := &receiver{arrived: make(chan struct{}, 1024)}
	r.srv = httptest.NewServer(http.HandlerFunc(r.serve))
	t.Cleanup(func() {
		r.release()
		r.srv.Close()
	})
	return r
}

// release lets held requests go (idempotent).
func (r *receiver) release() {
	r.mu.Lock()
	if r.hold != nil {
		select {
		case <-r.hold:
		default:
			close(r.hold)
		}
	}
	r.mu.Unlock()
}

func (r *receiver) serve(w http.ResponseWriter, req *http.Request) {
	select {
	case r.arrived <- struct{}{}:
	default:
	}
	r.mu.Lock()
	hold := r.hold
	r.mu.Unlock()
	if hold != nil {
		<-hold
	}
	body, err := io.ReadAll(req.Body)
	if err != nil {
		http.Error(w, err.Error(), 400)
		return
	}
	var msg coltracepb.ExportTraceServiceRequest
	if err := proto.Unmarshal(body, &msg); err != nil {
		http.Error(w, err.Error(), 400)
		return
	}
	r.mu.Lock()
	r.paths = append(r.paths, req.URL.Path)
	r.ctype = req.Header.Get("Content-Type")
	for _, rs := range msg.ResourceSpans {
		if r.resource == nil {
			r.resource = map[string]string{}
			for _, kv := range rs.GetResource().GetAttributes() {
				r.resource[kv.Key] = kv.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.ScopeSpans {
			r.spans = append(r.spans, ss.Spans...)
		}
	}
	r.mu.Unlock()
	out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

func (r *receiver) got() []*tracepb.Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*tracepb.Span(nil), r.spans...)
}

// attrs returns a span's attributes: strings and integers.
func attrs(sp *tracepb.Span) map[string]any {
	m := map[string]any{}
	for _, kv := range sp.Attributes {
		switch v := kv.GetValue().GetValue().(type) {
		case *commonpb.AnyValue_StringValue:
			m[kv.Key] = v.StringValue
		case *commonpb.AnyValue_IntValue:
			m[kv.Key] = v.IntValue
		default:
			m[kv.Key] = v
		}
	}
	return m
}
