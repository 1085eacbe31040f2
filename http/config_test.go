package http

import (
	"strings"
	"testing"
)

func TestParseBackend(t *testing.T) {
	tests := []struct {
		in      string
		want    BackendSpec
		wantErr string
	}{
		{in: "127.0.0.1:18081", want: BackendSpec{Addr: "127.0.0.1:18081", ID: "127.0.0.1:18081", Weight: 1}},
		{in: "app1:8080,weight=3,metrics=http://app1:9090/actuator/prometheus,health=/healthz,id=a1",
			want: BackendSpec{Addr: "app1:8080", ID: "a1", Weight: 3, MetricsURL: "http://app1:9090/actuator/prometheus", HealthPath: "/healthz"}},
		{in: "[::1]:80, weight=2 ", want: BackendSpec{Addr: "[::1]:80", ID: "[::1]:80", Weight: 2}},
		{in: "nohost", wantErr: "host:port"},
		{in: "h:99999", wantErr: "bad port"},
		{in: "h:1,weight=0", wantErr: "weight"},
		{in: "h:1,weight=x", wantErr: "weight"},
		{in: "h:1,metrics=ftp://x", wantErr: "metrics"},
		{in: "h:1,health=healthz", wantErr: "health"},
		{in: "h:1,color=red", wantErr: "unknown key"},
		{in: "h:1,weight", wantErr: "key=value"},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseBackend(tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), "http backend") {
					t.Fatalf("error = %v, want one naming the http backend and %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

func FuzzParseBackend(f *testing.F) {
	f.Add("127.0.0.1:18081,weight=2,metrics=http://x:1/m,health=/h,id=b")
	f.Add("h:1,,,")
	f.Fuzz(func(t *testing.T, s string) {
		spec, err := ParseBackend(s)
		if err == nil && (spec.Weight < 1 || spec.ID == "" || spec.Addr == "") {
			t.Fatalf("accepted %q as %+v", s, spec)
		}
	})
}
