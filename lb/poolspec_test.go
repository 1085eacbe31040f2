package lb

import (
	"strings"
	"testing"

	"github.com/sluicelb/sluice/admission"
)

func TestParsePoolSpec(t *testing.T) {
	tests := []struct {
		proto, in string
		want      PoolSpec
		canon     string // String(); "" when it is in
		wantErr   string
	}{
		{proto: "http", in: "name=api", want: PoolSpec{Name: "api"}},
		{proto: "sip", in: "name=london", want: PoolSpec{Name: "london"}},
		{proto: "http", in: "name=api,policy=least-outstanding,health=/healthz,hash-key=header:X-User",
			want:  PoolSpec{Name: "api", Policy: "least-outstanding", HashKey: "header:X-User", HealthPath: "/healthz"},
			canon: "name=api,policy=least-outstanding,hash-key=header:X-User,health=/healthz"},
		// Aliases read as the name they stand for, in any case.
		{proto: "sip", in: "name=london,policy=hash", want: PoolSpec{Name: "london", Policy: "consistent-hash"}, canon: "name=london,policy=consistent-hash"},
		{proto: "http", in: " Policy = WRR , NAME=web", want: PoolSpec{Name: "web", Policy: "weighted-round-robin"}, canon: "name=web,policy=weighted-round-robin"},
		{proto: "http", in: "name=a,policy=least-conn", want: PoolSpec{Name: "a", Policy: "least-outstanding"}, canon: "name=a,policy=least-outstanding"},
		// Hash keys in the grammar of -http-hash-key, written one way.
		{proto: "http", in: "name=a,hash-key=src", want: PoolSpec{Name: "a", HashKey: "source"}, canon: "name=a,hash-key=source"},
		{proto: "http", in: "name=a,hash-key=Cookie:JSESSIONID,policy=maglev", want: PoolSpec{Name: "a", Policy: "consistent-hash", HashKey: "cookie:JSESSIONID"},
			canon: "name=a,policy=consistent-hash,hash-key=cookie:JSESSIONID"},
		{proto: "http", in: "name=a,health=-", want: PoolSpec{Name: "a", HealthPath: "-"}},
		// A value may hold a comma when no key follows it.
		{proto: "http", in: "name=a,health=/h,x", want: PoolSpec{Name: "a", HealthPath: "/h,x"}},

		{proto: "http", in: "", wantErr: `pool "": empty: want name=NAME`},
		{proto: "http", in: "policy=rr", wantErr: `key name is required`},
		{proto: "http", in: "name=API", wantErr: `name: pool name "API" has upper case`},
		{proto: "http", in: "name=a b", wantErr: `pool name "a b": want a pool name: 1 to 64 characters out of a-z, 0-9, _ and -`},
		{proto: "http", in: "name=a,name=b", wantErr: `key "name" given twice`},
		{proto: "http", in: "name=a,policy=fastest", wantErr: `policy "fastest": want one of round-robin, weighted-round-robin, least-outstanding, p2c, consistent-hash`},
		{proto: "http", in: "name=a,policy=", wantErr: `policy "": want one of`},
		{proto: "http", in: "name=a,hash-key=body", wantErr: `hash-key "body": want source, header:NAME or cookie:NAME`},
		{proto: "http", in: "name=a,hash-key=header:", wantErr: `hash-key "header:": want source`},
		{proto: "http", in: "name=a,hash-key=cookie:a;b", wantErr: `hash-key "cookie:a;b": want source`},
		{proto: "http", in: "name=a,hash-key=source:x", wantErr: `hash-key "source:x"`},
		{proto: "http", in: "name=a,health=healthz", wantErr: `health "healthz": want an absolute path such as /healthz, or - for a TCP connect only`},
		{proto: "http", in: "name=a,health=/a b", wantErr: `health "/a b": want an absolute path`},
		{proto: "sip", in: "name=a,hash-key=call-id", wantErr: `key hash-key is for HTTP pools only: a SIP pool hashes the Call-ID`},
		{proto: "sip", in: "name=a,health=/h", wantErr: `key health is for HTTP pools only`},
		{proto: "http", in: "name=a,weight=2", wantErr: `unknown key "weight" for a http pool (want name, policy, hash-key, health)`},
		{proto: "http", in: "policy", wantErr: `pool "policy": "policy" is not key=value`},
		{proto: "http", in: "name=a,policy", wantErr: `pool name "a,policy": want`},
		{proto: "http", in: "name=a, =b", wantErr: `pool name "a, =b": want`},
		{proto: "ftp", in: "name=a", wantErr: `unknown protocol "ftp"`},
	}
	for _, tc := range tests {
		t.Run(tc.proto+" "+tc.in, func(t *testing.T) {
			got, err := ParsePoolSpec(tc.proto, tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error = %v, want one with %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %+v, %v; want %+v", got, err, tc.want)
			}
			canon := tc.canon
			if canon == "" {
				canon = tc.in
			}
			if got.String() != canon {
				t.Errorf("String() = %q, want %q", got.String(), canon)
			}
			back, err := ParsePoolSpec(tc.proto, got.String())
			if err != nil || back != got {
				t.Errorf("%q parses back to %+v, %v; want %+v", got.String(), back, err, got)
			}
		})
	}
}

func FuzzPoolSpec(f *testing.F) {
	f.Add("http", "name=api,policy=least-outstanding,health=/healthz,hash-key=header:X-User")
	f.Add("sip", "name=london,policy=hash")
	f.Add("http", "name=a,health=/x,y,policy=rr")
	f.Fuzz(func(t *testing.T, proto, s string) {
		p, err := ParsePoolSpec(proto, s)
		if err != nil {
			return
		}
		if admission.CheckPoolName(p.Name) != nil || proto == "sip" && (p.HashKey != "" || p.HealthPath != "") {
			t.Fatalf("ParsePoolSpec(%q, %q) = %+v", proto, s, p)
		}
		back, err := ParsePoolSpec(proto, p.String())
		if err != nil || back != p {
			t.Fatalf("round trip of %q: %+v -> %q -> %+v, %v", s, p, p.String(), back, err)
		}
	})
}
