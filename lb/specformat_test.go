package lb

import (
	"reflect"
	"testing"
)

func TestFormatBackendSpecRoundTrip(t *testing.T) {
	for _, tc := range []struct{ proto, in, want string }{
		{"http", "127.0.0.1:8081", "127.0.0.1:8081"},
		{"http", "127.0.0.1:8081, weight=3 ,id=h1,health=/ok,metrics=http://127.0.0.1:9/m", "127.0.0.1:8081,id=h1,weight=3,metrics=http://127.0.0.1:9/m,health=/ok"},
		{"sip", "10.0.0.1:5060,transport=tcp,id=s1,weight=1", "10.0.0.1:5060,id=s1,transport=tcp"},
		{"sip", "10.0.0.1:5060,transport=udp", "10.0.0.1:5060"},
		{"sip", "10.0.0.1:5060,proxy=v2,transport=tcp", "10.0.0.1:5060,transport=tcp,proxy=v2"},
		{"http", "10.0.0.1:80,proxy=v1,pool=api", "10.0.0.1:80,proxy=v1,pool=api"},
		{"sip", "10.0.0.1:5061,sni=core.example,transport=tls,ca=ca.pem", "10.0.0.1:5061,transport=tls,ca=ca.pem,sni=core.example"},
	} {
		spec, err := ParseBackendSpec(tc.proto, tc.in)
		if err != nil {
			t.Fatal(err)
		}
		got := FormatBackendSpec(tc.proto, spec)
		if got != tc.want {
			t.Errorf("FormatBackendSpec(%q) = %q, want %q", tc.in, got, tc.want)
		}
		back, err := ParseBackendSpec(tc.proto, got)
		if err != nil || !reflect.DeepEqual(back, spec) {
			t.Errorf("%q does not parse back: %+v %v", got, back, err)
		}
	}
}
