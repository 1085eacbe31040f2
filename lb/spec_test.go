package lb

import (
	"reflect"
	"strings"
	"testing"
)

func TestParseBackendSpec(t *testing.T) {
	tests := []struct {
		proto, in string
		want      BackendSpec
		wantErr   string
	}{
		{proto: "http", in: "127.0.0.1:18081", want: BackendSpec{Addr: "127.0.0.1:18081", ID: "127.0.0.1:18081", Weight: 1}},
		{proto: "sip", in: "127.0.0.1:5060", want: BackendSpec{Addr: "127.0.0.1:5060", ID: "127.0.0.1:5060", Weight: 1, Transport: "udp"}},
		{proto: "http", in: "app1:8080,weight=3,metrics=http://app1:9090/m,health=/healthz,id=a1",
			want: BackendSpec{Addr: "app1:8080", ID: "a1", Weight: 3, MetricsURL: "http://app1:9090/m", HealthPath: "/healthz"}},
		{proto: "sip", in: " [::1]:5070 , transport=TCP, weight=1000,id=s1",
			want: BackendSpec{Addr: "[::1]:5070", ID: "s1", Weight: 1000, Transport: "tcp"}},
		// One set of limits for both protocols.
		{proto: "http", in: "nohost", wantErr: "want host:port"},
		{proto: "sip", in: "nohost", wantErr: "want host:port"},
		{proto: "sip", in: ":5060", wantErr: "want host:port"},
		{proto: "http", in: "h:99999", wantErr: "bad port"},
		{proto: "sip", in: "h:0", wantErr: "bad port"},
		{proto: "http", in: "h:1,weight=0", wantErr: "weight must be"},
		{proto: "sip", in: "h:1,weight=1001", wantErr: "weight must be"},
		{proto: "http", in: "h:1,id=" + strings.Repeat("x", MaxIDLen+1), wantErr: "id must be"},
		{proto: "sip", in: "h:1,id=a b", wantErr: "id must be"},
		{proto: "http", in: "h:1,id=a\x01b", wantErr: "id must be"},
		{proto: "http", in: "h:1,metrics=ftp://x", wantErr: "metrics must be"},
		{proto: "http", in: "h:1,health=healthz", wantErr: "health must be"},
		{proto: "sip", in: "h:1,transport=sctp", wantErr: "transport must be udp or tcp"},
		// Keys of the other protocol are refused.
		{proto: "sip", in: "h:1,health=/h", wantErr: `unknown key "health" for a sip backend`},
		{proto: "http", in: "h:1,transport=tcp", wantErr: `unknown key "transport" for a http backend`},
		{proto: "http", in: "h:1,weight", wantErr: "key=value"},
		{proto: "ftp", in: "h:1", wantErr: "unknown protocol"},
	}
	for _, tc := range tests {
		t.Run(tc.proto+" "+tc.in, func(t *testing.T) {
			got, err := ParseBackendSpec(tc.proto, tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error = %v, want one with %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

func FuzzParseBackendSpec(f *testing.F) {
	f.Add("http", "127.0.0.1:18081,weight=2,metrics=http://x:1/m,health=/h,id=b")
	f.Add("sip", "10.0.0.1:5060,transport=tcp,weight=3,id=b1")
	f.Add("sip", "h:1,,,")
	f.Fuzz(func(t *testing.T, proto, s string) {
		b, err := ParseBackendSpec(proto, s)
		if err != nil {
			return
		}
		if b.ID == "" || (b.ID != b.Addr && len(b.ID) > MaxIDLen) || b.Addr == "" || b.Weight < 1 || b.Weight > MaxWeight ||
			(proto == "sip") != (b.Transport == "udp" || b.Transport == "tcp") || (proto == "sip" && b.HealthPath != "") {
			t.Fatalf("ParseBackendSpec(%q, %q) = %+v", proto, s, b)
		}
		// What parses formats back to a spec that parses to the same
		// backend: the form /control/config prints and -config reads.
		text := FormatBackendSpec(proto, b)
		again, err := ParseBackendSpec(proto, text)
		if err != nil {
			t.Fatalf("ParseBackendSpec(%q, %q) = %+v, formatted %q does not parse: %v", proto, s, b, text, err)
		}
		if !reflect.DeepEqual(again, b) {
			t.Fatalf("round trip of %q: %+v -> %q -> %+v", s, b, text, again)
		}
	})
}
