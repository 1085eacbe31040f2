package lb

import (
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/sluicelb/sluice/admission"
)

func TestParseBackendSpec(t *testing.T) {
	def := []string{DefaultPool}
	tests := []struct {
		proto, in string
		want      BackendSpec
		wantErr   string
	}{
		{proto: "http", in: "127.0.0.1:18081", want: BackendSpec{Addr: "127.0.0.1:18081", ID: "127.0.0.1:18081", Weight: 1, Pools: def}},
		{proto: "sip", in: "127.0.0.1:5060", want: BackendSpec{Addr: "127.0.0.1:5060", ID: "127.0.0.1:5060", Weight: 1, Transport: "udp", Pools: def}},
		{proto: "http", in: "app1:8080,weight=3,metrics=http://app1:9090/m,health=/healthz,id=a1",
			want: BackendSpec{Addr: "app1:8080", ID: "a1", Weight: 3, MetricsURL: "http://app1:9090/m", HealthPath: "/healthz", Pools: def}},
		{proto: "sip", in: " [::1]:5070 , transport=TCP, weight=1000,id=s1",
			want: BackendSpec{Addr: "[::1]:5070", ID: "s1", Weight: 1000, Transport: "tcp", Pools: def}},
		// Pools: repeatable, in the order given; a backend in two pools is one spec.
		{proto: "http", in: "h:1,pool=api,pool=web", want: BackendSpec{Addr: "h:1", ID: "h:1", Weight: 1, Pools: []string{"api", "web"}}},
		{proto: "sip", in: "h:1,pool=london", want: BackendSpec{Addr: "h:1", ID: "h:1", Weight: 1, Transport: "udp", Pools: []string{"london"}}},
		{proto: "http", in: "h:1,pool=default,pool=a_b-9", want: BackendSpec{Addr: "h:1", ID: "h:1", Weight: 1, Pools: []string{"default", "a_b-9"}}},
		{proto: "http", in: "h:1,pool=" + strings.Repeat("p", admission.MaxPoolName), want: BackendSpec{Addr: "h:1", ID: "h:1", Weight: 1, Pools: []string{strings.Repeat("p", admission.MaxPoolName)}}},
		{proto: "http", in: "h:1,pool=API", wantErr: `backend "h:1,pool=API": pool: pool name "API" has upper case: want a pool name: 1 to 64 characters out of a-z, 0-9, _ and - (lower case)`},
		{proto: "sip", in: "h:1,pool=", wantErr: `pool name "": want a pool name: 1 to 64 characters`},
		{proto: "http", in: "h:1,pool=a.b", wantErr: `pool name "a.b": want a pool name`},
		{proto: "http", in: "h:1,pool=" + strings.Repeat("p", admission.MaxPoolName+1), wantErr: "want a pool name: 1 to 64 characters"},
		{proto: "http", in: "h:1,pool=api,pool=web,pool=api", wantErr: `pool "api" given twice`},
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
		{proto: "sip", in: "h:1,transport=sctp", wantErr: "transport must be udp, tcp or tls"},
		{proto: "sip", in: "h:1,transport=TLS,ca=/etc/sip/ca.pem,sni=Core.Example", want: BackendSpec{Addr: "h:1", ID: "h:1", Weight: 1, Transport: "tls", CAFile: "/etc/sip/ca.pem", SNI: "core.example", Pools: def}},
		{proto: "sip", in: "h:1,ca=/etc/sip/ca.pem", wantErr: "ca and sni need transport=tls"},
		{proto: "sip", in: "h:1,transport=tcp,sni=core.example", wantErr: "ca and sni need transport=tls"},
		{proto: "sip", in: "h:1,transport=tls,sni=a b", wantErr: `sni "a b": want a host name`},
		{proto: "sip", in: "h:1,transport=tls,ca=", wantErr: "ca must name a PEM file"},
		{proto: "http", in: "h:1,proxy=V2", want: BackendSpec{Addr: "h:1", ID: "h:1", Weight: 1, Proxy: 2, Pools: def}},
		{proto: "http", in: "h:1,proxy=v1,tls=on", want: BackendSpec{Addr: "h:1", ID: "h:1", Weight: 1, Proxy: 1, TLS: true, Pools: def}},
		{proto: "http", in: "h:1,proxy=off", want: BackendSpec{Addr: "h:1", ID: "h:1", Weight: 1, Pools: def}},
		{proto: "http", in: "h:1,proxy=v3", wantErr: `proxy must be v1, v2 or off (got "v3")`},
		{proto: "sip", in: "h:1,proxy=v2,transport=tcp", want: BackendSpec{Addr: "h:1", ID: "h:1", Weight: 1, Transport: "tcp", Proxy: 2, Pools: def}},
		{proto: "sip", in: "h:1,proxy=v2", wantErr: "proxy needs transport=tcp (a SIP backend over udp gets no PROXY header)"},
		{proto: "sip", in: "h:1,transport=tls,proxy=v1", wantErr: "proxy needs transport=tcp"},
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
	f.Add("http", "h:1,pool=api,pool=web")
	f.Add("sip", "h:1,pool=default,pool=x")
	f.Add("http", "dns:app.internal:8080,weight=2,metrics=http://{host}:9/m")
	f.Add("sip", "srv:example.com,transport=tcp,pool=x")
	f.Add("sip", "naptr:example.com")
	f.Fuzz(func(t *testing.T, proto, s string) {
		b, err := ParseBackendSpec(proto, s)
		if err != nil {
			return
		}
		if b.ID == "" || (b.ID != b.Addr && len(b.ID) > MaxIDLen) || b.Addr == "" || b.Weight < 1 || b.Weight > MaxWeight ||
			(proto == "sip") != (b.Transport == "udp" || b.Transport == "tcp" || b.Transport == "tls") || (proto == "sip" && b.HealthPath != "") ||
			len(b.Pools) == 0 {
			t.Fatalf("ParseBackendSpec(%q, %q) = %+v", proto, s, b)
		}
		for i, p := range b.Pools {
			if admission.CheckPoolName(p) != nil || slices.Contains(b.Pools[:i], p) {
				t.Fatalf("ParseBackendSpec(%q, %q): pools %q", proto, s, b.Pools)
			}
		}
		if b.String() != FormatBackendSpec(proto, b) {
			t.Fatalf("%+v: String() = %q, FormatBackendSpec(%q) = %q", b, b.String(), proto, FormatBackendSpec(proto, b))
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

// TestBackendSpecString: String is the canonical form (keys at their
// default left out, pools in the order given) and parses back equal.
func TestBackendSpecString(t *testing.T) {
	for _, tc := range []struct{ proto, in, want string }{
		{"http", "h:1", "h:1"},
		{"http", "h:1,pool=default", "h:1"},
		{"http", "h:1, pool=web ,id=w1,pool=api", "h:1,id=w1,pool=web,pool=api"},
		{"http", "h:1,pool=default,pool=api", "h:1,pool=default,pool=api"},
		{"sip", "10.0.0.1:5060,pool=london,transport=tcp", "10.0.0.1:5060,transport=tcp,pool=london"},
		{"sip", "10.0.0.1:5060,pool=london", "10.0.0.1:5060,pool=london"},
	} {
		spec, err := ParseBackendSpec(tc.proto, tc.in)
		if err != nil {
			t.Fatalf("%q: %v", tc.in, err)
		}
		if got := spec.String(); got != tc.want {
			t.Errorf("String(%q) = %q, want %q", tc.in, got, tc.want)
		}
		back, err := ParseBackendSpec(tc.proto, spec.String())
		if err != nil || !reflect.DeepEqual(back, spec) {
			t.Errorf("%q does not parse back: %+v %v, want %+v", spec.String(), back, err, spec)
		}
	}
}

// TestBackendSpecKeysOnce: a key other than pool= given twice is refused
// (the last one used to win silently), and a TLS backend's spec is
// written with each key once.
func TestBackendSpecKeysOnce(t *testing.T) {
	for _, tc := range []struct{ proto, in string }{
		{"http", "127.0.0.1:8080,weight=2,weight=3"},
		{"http", "127.0.0.1:8080,id=x,ID=y"},
		{"http", "127.0.0.1:8443,tls=on,ca=/a.pem,ca=/b.pem"},
		{"sip", "127.0.0.1:5061,transport=tls,transport=tcp"},
	} {
		if _, err := ParseBackendSpec(tc.proto, tc.in); err == nil || !strings.Contains(err.Error(), "given twice") {
			t.Errorf("%s %q: %v, want a key given twice refused", tc.proto, tc.in, err)
		}
	}
	for _, tc := range []struct{ proto, in, want string }{
		{"http", "127.0.0.1:8443,tls=on,ca=/p/ca.pem,sni=api.example.com,pool=sec", "127.0.0.1:8443,tls=on,ca=/p/ca.pem,sni=api.example.com,pool=sec"},
		{"sip", "127.0.0.1:5061,transport=tls,ca=/p/ca.pem,sni=edge.example.com", "127.0.0.1:5061,transport=tls,ca=/p/ca.pem,sni=edge.example.com"},
	} {
		b, err := ParseBackendSpec(tc.proto, tc.in)
		if err != nil {
			t.Fatal(err)
		}
		if got := FormatBackendSpec(tc.proto, b); got != tc.want {
			t.Errorf("FormatBackendSpec(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
