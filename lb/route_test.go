package lb

import (
	"bytes"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/sluicelb/sluice/admission"
)

func TestParseRouteSpec(t *testing.T) {
	tests := []struct {
		proto, in string
		want      RouteSpec
		canon     string // String(); "" when it is in
		wantErr   string
	}{
		{proto: "http", in: "pool=api", want: RouteSpec{Proto: "http", Pool: "api"}},
		{proto: "http", in: "pool=api,host=api.example.com", want: RouteSpec{Proto: "http", Pool: "api", Host: "api.example.com"}},
		{proto: "http", in: "host=API.Example.COM.,pool=api", want: RouteSpec{Proto: "http", Pool: "api", Host: "api.example.com"}, canon: "pool=api,host=api.example.com"},
		{proto: "http", in: "pool=web,host=*.example.com", want: RouteSpec{Proto: "http", Pool: "web", Host: "*.example.com"}},
		{proto: "http", in: "pool=v6,host=[2001:DB8:0::1]", want: RouteSpec{Proto: "http", Pool: "v6", Host: "[2001:db8::1]"}, canon: "pool=v6,host=[2001:db8::1]"},
		{proto: "http", in: "pool=ip,host=10.0.0.1", want: RouteSpec{Proto: "http", Pool: "ip", Host: "10.0.0.1"}},
		{proto: "http", in: "pool=files,path=/static/,strip=/static", want: RouteSpec{Proto: "http", Pool: "files", Prefix: "/static/", Strip: "/static"}},
		{proto: "http", in: "pool=files,path=/static/img,strip=/static/", want: RouteSpec{Proto: "http", Pool: "files", Prefix: "/static/img", Strip: "/static/"}},
		{proto: "http", in: "pool=files,path=/static,strip=/static", want: RouteSpec{Proto: "http", Pool: "files", Prefix: "/static", Strip: "/static"}},
		{proto: "http", in: "pool=a,path=~/a/[0-9]+", want: RouteSpec{Proto: "http", Pool: "a", Regex: "/a/[0-9]+"}},
		{proto: "http", in: "pool=a,path=~/a/[0-9]{1,3},strip=/a", want: RouteSpec{Proto: "http", Pool: "a", Regex: "/a/[0-9]{1,3}", Strip: "/a"}},
		{proto: "http", in: "PATH=/x, Method=POST ,Header=X-Tenant: blue ,pool=t", want: RouteSpec{Proto: "http", Pool: "t", Prefix: "/x", Method: "POST", Header: "x-tenant", HeaderValue: "blue"},
			canon: "pool=t,path=/x,method=POST,header=x-tenant:blue"},
		{proto: "http", in: "pool=t,header=Accept:text/html, application/json", want: RouteSpec{Proto: "http", Pool: "t", Header: "accept", HeaderValue: "text/html, application/json"},
			canon: "pool=t,header=accept:text/html, application/json"},
		{proto: "http", in: "pool=t,header=X-A:a=b", want: RouteSpec{Proto: "http", Pool: "t", Header: "x-a", HeaderValue: "a=b"}, canon: "pool=t,header=x-a:a=b"},
		{proto: "sip", in: "pool=london,user=+4420", want: RouteSpec{Proto: "sip", Pool: "london", Prefix: "+4420"}},
		{proto: "sip", in: "pool=london,domain=Voice.Example,user=~\\+44[0-9]{6,10},method=INVITE,header=X-Tenant:a,from-domain=*.carrier.net",
			want:  RouteSpec{Proto: "sip", Pool: "london", Host: "voice.example", Regex: `\+44[0-9]{6,10}`, Method: "INVITE", Header: "x-tenant", HeaderValue: "a", FromDomain: "*.carrier.net"},
			canon: `pool=london,domain=voice.example,user=~\+44[0-9]{6,10},method=INVITE,header=x-tenant:a,from-domain=*.carrier.net`},
		{proto: "sip", in: "pool=reg,method=REGISTER", want: RouteSpec{Proto: "sip", Pool: "reg", Method: "REGISTER"}},

		// Errors: golden substrings naming the key, the value and what is wanted.
		{proto: "http", in: "", wantErr: `route "": empty: want pool=NAME`},
		{proto: "http", in: "host=a.example.com", wantErr: `key pool is required (pool=NAME)`},
		{proto: "http", in: "pool=,host=a", wantErr: `key "pool" has no value`},
		{proto: "http", in: "pool=Api", wantErr: `pool: pool name "Api" has upper case`},
		{proto: "http", in: "pool=a,colour=red", wantErr: `unknown key "colour" for a http route (want pool, host, path, method, header, strip)`},
		{proto: "http", in: "pool=a,header=X-T:\xff", wantErr: "not valid UTF-8"},
		{proto: "http", in: "pool=a,user=+44", wantErr: `key "user" is for SIP routes only (a http route takes pool, host, path, method, header, strip)`},
		{proto: "http", in: "pool=a,domain=x", wantErr: `key "domain" is for SIP routes only`},
		{proto: "http", in: "pool=a,from-domain=x", wantErr: `key "from-domain" is for SIP routes only`},
		{proto: "sip", in: "pool=a,host=x", wantErr: `key "host" is for HTTP routes only`},
		{proto: "sip", in: "pool=a,path=/x", wantErr: `key "path" is for HTTP routes only`},
		{proto: "sip", in: "pool=a,strip=/x", wantErr: `key "strip" is for HTTP routes only`},
		{proto: "http", in: "pool=a,host=x,host=y", wantErr: `key "host" given twice`},
		{proto: "http", in: "pool=a,pool=b", wantErr: `key "pool" given twice`},
		{proto: "http", in: "pool=a,host=a.example.com:8080", wantErr: `host "a.example.com:8080": want a host name`},
		{proto: "http", in: "pool=a,host=*", wantErr: `host "*": want a host name`},
		{proto: "http", in: "pool=a,host=a.*.com", wantErr: `host "a.*.com": want a host name`},
		{proto: "http", in: "pool=a,host=a..com", wantErr: `host "a..com"`},
		{proto: "http", in: "pool=a,host=[::1]:80", wantErr: `host "[::1]:80": want a host name, *.DOMAIN or a bracketed IPv6 address`},
		{proto: "http", in: "pool=a,host=" + strings.Repeat("a", 254), wantErr: `want a host name`},
		{proto: "sip", in: "pool=a,domain=a b", wantErr: `domain "a b": want a host name`},
		{proto: "sip", in: "pool=a,from-domain=*.", wantErr: `from-domain "*.": want a host name`},
		{proto: "http", in: "pool=a,path=static", wantErr: `path "static": want a prefix starting with / (or ~REGEX)`},
		{proto: "http", in: "pool=a,path=/a b", wantErr: `path "/a b": want 1..1024 bytes without spaces`},
		{proto: "http", in: "pool=a,path=/" + strings.Repeat("a", MaxRouteValueLen), wantErr: `want 1..1024 bytes`},
		{proto: "http", in: "pool=a,path=~/a/(", wantErr: `path "~/a/(": bad regular expression: error parsing regexp: missing closing )`},
		{proto: "http", in: "pool=a,path=~", wantErr: `path "~": want a regular expression of 1..4096 bytes after ~`},
		// A pattern that would escape the anchors is refused, not anchored wrong.
		{proto: "http", in: "pool=a,path=~/a)|(/b", wantErr: `bad regular expression: error parsing regexp: unexpected )`},
		{proto: "sip", in: "pool=a,user=~[", wantErr: `user "~[": bad regular expression`},
		{proto: "http", in: "pool=a,method=GE T", wantErr: `method "GE T": want a method name`},
		{proto: "http", in: "pool=a,header=X-A", wantErr: `header "X-A": want NAME:VALUE`},
		{proto: "http", in: "pool=a,header=X-A:", wantErr: `header "X-A:": want NAME:VALUE`},
		{proto: "http", in: "pool=a,header=X A:b", wantErr: `header "X A:b": want NAME:VALUE`},
		{proto: "http", in: "pool=a,strip=static", wantErr: `strip "static": want a path prefix such as /static`},
		{proto: "http", in: "pool=a,strip=/", wantErr: `strip "/": want a path prefix`},
		{proto: "http", in: "pool=a,path=/static/,strip=/files", wantErr: `strip "/files" is not a prefix of path "/static/"`},
		{proto: "http", in: "pool=a,path=/static/,strip=/stat", wantErr: `strip "/stat" ends inside a segment of path "/static/": it strips whole segments only (such as strip=/static)`},
		{proto: "http", in: "pool=a,path=/a/static,strip=/a/stat", wantErr: `(such as strip=/a/static)`},
		{proto: "http", in: "pool=a,host", wantErr: `pool: pool name "a,host": want`},
		{proto: "http", in: "host", wantErr: `"host" is not key=value`},
		{proto: "ftp", in: "pool=a", wantErr: `unknown protocol "ftp"`},
	}
	for _, tc := range tests {
		t.Run(tc.proto+" "+tc.in, func(t *testing.T) {
			got, err := ParseRouteSpec(tc.proto, tc.in)
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
			back, err := ParseRouteSpec(tc.proto, got.String())
			if err != nil || back != got {
				t.Errorf("%q parses back to %+v, %v; want %+v", got.String(), back, err, got)
			}
		})
	}
}

func FuzzRouteSpec(f *testing.F) {
	f.Add("http", "pool=api,host=*.Example.com,path=/static/,method=GET,header=X-A:b,strip=/static")
	f.Add("http", "pool=a,path=~/a/[0-9]{1,3}")
	f.Add("sip", `pool=london,domain=voice.example,user=~\+44[0-9]{6,10},method=INVITE,header=X-T:a, b,from-domain=*.c.net`)
	f.Add("sip", "pool=l,user=+4420")
	f.Fuzz(func(t *testing.T, proto, s string) {
		r, err := ParseRouteSpec(proto, s)
		if err != nil {
			return
		}
		if r.Proto != proto || admission.CheckPoolName(r.Pool) != nil || r.Prefix != "" && r.Regex != "" {
			t.Fatalf("ParseRouteSpec(%q, %q) = %+v", proto, s, r)
		}
		back, err := ParseRouteSpec(proto, r.String())
		if err != nil || back != r {
			t.Fatalf("round trip of %q: %+v -> %q -> %+v, %v", s, r, r.String(), back, err)
		}
		if _, err := NewRouteTable(proto, []RouteSpec{r}); err != nil {
			t.Fatalf("NewRouteTable(%q): %v", r, err)
		}
	})
}

// mustTable builds a table of specs written as strings.
func mustTable(t testing.TB, proto string, specs ...string) *RouteTable {
	t.Helper()
	var rs []RouteSpec
	for _, s := range specs {
		r, err := ParseRouteSpec(proto, s)
		if err != nil {
			t.Fatal(err)
		}
		rs = append(rs, r)
	}
	tab, err := NewRouteTable(proto, rs)
	if err != nil {
		t.Fatal(err)
	}
	return tab
}

// input builds a RouteInput; headers are name, value pairs of the table's
// HeaderNames (a name not tested by the table is dropped).
func input(tab *RouteTable, host, path, method, from string, headers ...string) *RouteInput {
	in := &RouteInput{Method: []byte(method)}
	if host != "" {
		in.Host = []byte(host)
	}
	if path != "" {
		in.Path = []byte(path)
	}
	if from != "" {
		in.FromHost = []byte(from)
	}
	names := tab.HeaderNames()
	for i := 0; i+1 < len(headers); i += 2 {
		if k := slices.Index(names, strings.ToLower(headers[i])); k >= 0 {
			in.Headers[k] = []byte(headers[i+1])
		}
	}
	return in
}

func TestRouteTableHTTP(t *testing.T) {
	tab := mustTable(t, "http",
		"pool=api,host=api.example.com",                  // 0
		"pool=wild,host=*.example.com,path=/w/",          // 1
		"pool=files,path=/static/,strip=/static",         // 2
		"pool=num,path=~/a/[0-9]+",                       // 3
		"pool=get,path=/get,method=GET",                  // 4
		"pool=post,path=/get,method=POST",                // 5
		"pool=blue,header=X-Tenant:blue",                 // 6
		"pool=red,path=/t,header=x-tenant:Red",           // 7
		"pool=long,path=/static/img/",                    // 8: shadowed by 2
		"pool=api2,host=api.example.com,path=/v2",        // 9: shadowed by 0
		"pool=apex,host=example.com",                     // 10
		"pool=v6,host=[2001:db8::1]",                     // 11
		"pool=lower,method=get",                          // 12: methods are case-sensitive
		"pool=cookie,header=Cookie:a=1; b=2",             // 13
		"pool=catchall",                                  // 14
		"pool=never,host=never.example.org,method=PATCH", // 15: after the catch-all
	)
	tests := []struct {
		name                     string
		host, path, method, from string
		headers                  []string
		want                     int
	}{
		{name: "exact host", host: "api.example.com", path: "/v2/x", method: "GET", want: 0},
		{name: "first match wins over a later, more specific route", host: "api.example.com", path: "/static/a.css", method: "GET", want: 0},
		{name: "host upper case", host: "API.Example.COM", path: "/", method: "GET", want: 0},
		{name: "host with port", host: "api.example.com:8443", path: "/", method: "GET", want: 0},
		{name: "host with trailing dot", host: "api.example.com.", path: "/", method: "GET", want: 0},
		{name: "host with trailing dot and port", host: "API.example.com.:80", path: "/", method: "GET", want: 0},
		{name: "host with two trailing dots", host: "api.example.com..", path: "/", method: "GET", want: 0},
		{name: "wildcard one label", host: "a.example.com", path: "/w/x", method: "GET", want: 1},
		{name: "wildcard two labels", host: "a.b.example.com", path: "/w/", method: "GET", want: 1},
		{name: "wildcard, other condition fails", host: "a.example.com", path: "/x", method: "GET", want: 14},
		{name: "wildcard not the apex", host: "example.com", path: "/w/", method: "GET", want: 10},
		{name: "wildcard not a longer name", host: "badexample.com", path: "/w/", method: "GET", want: 14},
		{name: "wildcard not an empty label", host: ".example.com", path: "/w/", method: "GET", want: 14},
		{name: "prefix", host: "x.org", path: "/static/a.css", method: "GET", want: 2},
		{name: "prefix, longer route later is shadowed", host: "x.org", path: "/static/img/a.png", method: "GET", want: 2},
		{name: "prefix is a byte prefix", host: "x.org", path: "/static/", method: "GET", want: 2},
		{name: "prefix not met", host: "x.org", path: "/stati", method: "GET", want: 14},
		{name: "regex whole path", host: "x.org", path: "/a/12", method: "GET", want: 3},
		{name: "regex anchored at the end", host: "x.org", path: "/a/12/x", method: "GET", want: 14},
		{name: "regex anchored at the start", host: "x.org", path: "/x/a/12", method: "GET", want: 14},
		{name: "method GET", host: "x.org", path: "/get", method: "GET", want: 4},
		{name: "method HEAD takes a GET route", host: "x.org", path: "/get", method: "HEAD", want: 4},
		{name: "method POST", host: "x.org", path: "/get", method: "POST", want: 5},
		{name: "method is case-sensitive", host: "x.org", path: "/get", method: "post", want: 14},
		{name: "method get only for get", host: "x.org", path: "/", method: "get", want: 12},
		{name: "header exact", host: "x.org", path: "/", method: "GET", headers: []string{"x-tenant", "blue"}, want: 6},
		{name: "header value is exact", host: "x.org", path: "/", method: "GET", headers: []string{"x-tenant", "Blue"}, want: 14},
		{name: "header name any case", host: "x.org", path: "/t", method: "GET", headers: []string{"X-TENANT", "Red"}, want: 7},
		{name: "header absent", host: "x.org", path: "/t", method: "GET", want: 14},
		{name: "header present empty", host: "x.org", path: "/t", method: "GET", headers: []string{"x-tenant", ""}, want: 14},
		{name: "header value with = and ;", host: "x.org", path: "/", method: "GET", headers: []string{"cookie", "a=1; b=2"}, want: 13},
		{name: "ipv6 host with port", host: "[2001:db8::1]:8080", path: "/", method: "GET", want: 11},
		{name: "no host", path: "/", method: "GET", want: 14},
		{name: "catch-all", host: "other.net", path: "/", method: "PATCH", want: 14},
		{name: "overlong host matches no host route", host: strings.Repeat("a", 300) + ".example.com", path: "/w/", method: "GET", want: 14},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := tab.Match(input(tab, tc.host, tc.path, tc.method, tc.from, tc.headers...)); got != tc.want {
				t.Fatalf("Match = %d (%v), want %d (%v)", got, specAt(tab, got), tc.want, specAt(tab, tc.want))
			}
		})
	}

	// Without a catch-all, what matches nothing is -1.
	tab = mustTable(t, "http", "pool=api,host=api.example.com", "pool=files,path=/static/")
	for _, in := range []*RouteInput{
		input(tab, "www.example.com", "/", "GET", ""),
		input(tab, "", "", "", ""),
		{},
	} {
		if got := tab.Match(in); got != -1 {
			t.Errorf("Match(%q %q) = %d, want -1", in.Host, in.Path, got)
		}
	}
	var empty *RouteTable
	if got := empty.Match(&RouteInput{}); got != -1 {
		t.Errorf("nil table: Match = %d, want -1", got)
	}
}

func specAt(t *RouteTable, i int) string {
	if i < 0 {
		return "none"
	}
	return t.Spec(i).String()
}

func TestRouteTableSIP(t *testing.T) {
	tab := mustTable(t, "sip",
		"pool=london,user=+4420",                        // 0
		"pool=uk,user=+44",                              // 1
		"pool=reg,method=REGISTER",                      // 2
		"pool=carrier,from-domain=*.carrier.net",        // 3
		"pool=voice,domain=voice.example,method=INVITE", // 4
		"pool=num,user=~[0-9]{4}",                       // 5
		"pool=wild,domain=*.voice.example",              // 6
		"pool=tenant,header=X-Tenant:a",                 // 7
		"pool=exactfrom,from-domain=partner.example",    // 8
	)
	tests := []struct {
		name                     string
		host, user, method, from string
		headers                  []string
		want                     int
	}{
		{name: "user prefix +4420", host: "x", user: "+442079460000", method: "INVITE", want: 0},
		{name: "user prefix +442 is not +4420", host: "x", user: "+442179460000", method: "INVITE", want: 1},
		{name: "user prefix shorter than the route", host: "x", user: "+442", method: "INVITE", want: 1},
		{name: "register", host: "x", user: "alice", method: "REGISTER", want: 2},
		{name: "method is case-sensitive", host: "x", user: "alice", method: "register", want: -1},
		{name: "from wildcard", host: "x", user: "alice", method: "INVITE", from: "gw1.carrier.net", want: 3},
		{name: "from wildcard not the apex", host: "x", user: "alice", method: "INVITE", from: "carrier.net", want: -1},
		{name: "from exact, any case", host: "x", user: "alice", method: "MESSAGE", from: "Partner.Example", want: 8},
		{name: "domain and method", host: "VOICE.example", user: "bob", method: "INVITE", want: 4},
		{name: "domain, method not met", host: "voice.example", user: "bob", method: "OPTIONS", want: -1},
		{name: "user regex", host: "x", user: "1234", method: "OPTIONS", want: 5},
		{name: "user regex anchored", host: "x", user: "12345", method: "OPTIONS", want: -1},
		{name: "domain wildcard", host: "edge.voice.example", user: "bob", method: "OPTIONS", want: 6},
		{name: "domain with port", host: "voice.example:5060", user: "bob", method: "INVITE", want: 4},
		{name: "header", host: "x", user: "bob", method: "OPTIONS", headers: []string{"x-tenant", "a"}, want: 7},
		{name: "nothing", host: "x", user: "bob", method: "OPTIONS", want: -1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := tab.Match(input(tab, tc.host, tc.user, tc.method, tc.from, tc.headers...)); got != tc.want {
				t.Fatalf("Match = %d (%v), want %d (%v)", got, specAt(tab, got), tc.want, specAt(tab, tc.want))
			}
		})
	}
}

func TestStripPrefix(t *testing.T) {
	for _, tc := range []struct{ path, strip, want string }{
		{"/static/a.css", "/static", "/a.css"},
		{"/static", "/static", "/"},
		{"/static/", "/static", "/"},
		{"/static/a.css", "/static/", "/a.css"},
		{"/static/", "/static/", "/"},
		{"/staticfile", "/static", "/staticfile"}, // whole segments only
		{"/other/a.css", "/static", "/other/a.css"},
		{"/stat", "/static", "/stat"},
		{"/a/b/c", "/a/b", "/c"},
		{"/a", "", "/a"},
	} {
		got := StripPrefix([]byte(tc.path), tc.strip)
		if string(got) != tc.want {
			t.Errorf("StripPrefix(%q, %q) = %q, want %q", tc.path, tc.strip, got, tc.want)
		}
	}
	tab := mustTable(t, "http", "pool=files,path=/static/,strip=/static", "pool=a")
	if got := tab.StripPath(0, []byte("/static/x/y")); string(got) != "/x/y" {
		t.Errorf("StripPath(0) = %q", got)
	}
	if got := tab.StripPath(1, []byte("/static/x/y")); string(got) != "/static/x/y" {
		t.Errorf("StripPath(1) = %q", got)
	}
}

func TestRouteTableAccessors(t *testing.T) {
	tab := mustTable(t, "http",
		"pool=a,header=X-B:1",
		"pool=b,header=x-a:2",
		"pool=c,header=X-b:3",
		"pool=d",
	)
	if got, want := tab.HeaderNames(), []string{"x-a", "x-b"}; !slices.Equal(got, want) {
		t.Errorf("HeaderNames = %q, want %q", got, want)
	}
	if tab.Len() != 4 || tab.Spec(2).String() != "pool=c,header=x-b:3" {
		t.Errorf("Len = %d, Spec(2) = %q", tab.Len(), tab.Spec(2))
	}
	ins := []*RouteInput{
		input(tab, "", "/", "GET", "", "x-b", "3"),
		input(tab, "", "/", "GET", "", "x-b", "3"),
		input(tab, "", "/", "GET", "", "x-a", "2"),
		input(tab, "", "/", "GET", ""),
		input(tab, "", "/", "GET", "", "x-b", "1", "x-a", "2"),
	}
	for _, in := range ins {
		tab.Match(in)
	}
	for i, want := range []uint64{1, 1, 2, 1} {
		if got := tab.Hits(i); got != want {
			t.Errorf("Hits(%d) = %d, want %d", i, got, want)
		}
	}
}

func TestNewRouteTableErrors(t *testing.T) {
	r := func(proto, s string) RouteSpec {
		rs, err := ParseRouteSpec(proto, s)
		if err != nil {
			t.Fatal(err)
		}
		return rs
	}
	many := make([]RouteSpec, MaxRoutes+1)
	for i := range many {
		many[i] = r("http", "pool=a")
	}
	var headers []RouteSpec
	for i := range MaxRouteHeaders + 1 {
		headers = append(headers, r("sip", fmt.Sprintf("pool=a,header=X-%d:v", i)))
	}
	for _, tc := range []struct {
		proto   string
		routes  []RouteSpec
		wantErr string
	}{
		{"http", many, "1025 http routes: at most 1024"},
		{"sip", headers, "the sip routes test 9 distinct headers (x-0, x-1, x-2, x-3, x-4, x-5, x-6, x-7, x-8): at most 8"},
		{"http", []RouteSpec{r("sip", "pool=a")}, `route 1 (pool=a): a "sip" route in the http table`},
		{"http", []RouteSpec{{Proto: "http", Pool: "a", Host: "A.example.com"}}, "route 1 (pool=a,host=A.example.com): not canonical (ParseRouteSpec gives pool=a,host=a.example.com)"},
		{"http", []RouteSpec{{Proto: "http", Pool: "a", Host: "a.com,method=GET"}}, "not canonical"},
		{"http", []RouteSpec{{Proto: "http", Pool: "a", Regex: "("}}, `route 1: route "pool=a,path=~(": path "~(": bad regular expression`},
		{"ftp", nil, `unknown protocol "ftp"`},
	} {
		_, err := NewRouteTable(tc.proto, tc.routes)
		if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("NewRouteTable: %v, want an error with %q", err, tc.wantErr)
		}
	}
	if _, err := NewRouteTable("http", many[:MaxRoutes]); err != nil {
		t.Errorf("MaxRoutes routes: %v", err)
	}
}

// TestMatchAllocs: route selection allocates nothing, whatever it finds.
func TestMatchAllocs(t *testing.T) {
	tab := mustTable(t, "http", "pool=a,host=*.example.com,path=~/a/[0-9]+", "pool=b,host=x.org,header=X-A:1", "pool=c,path=/s/,method=GET")
	ins := []*RouteInput{
		input(tab, "A.B.Example.com:80", "/a/1", "GET", ""),
		input(tab, "x.org", "/", "GET", "", "x-a", "1"),
		input(tab, "y.org", "/s/x", "HEAD", ""),
		input(tab, "y.org", "/none", "PUT", ""),
	}
	for _, in := range ins {
		if n := testing.AllocsPerRun(100, func() { tab.Match(in) }); n != 0 {
			t.Errorf("Match(%q %q) allocates %v", in.Host, in.Path, n)
		}
	}
}

// Reference: the first route whose every condition holds, tested one
// route at a time with plain string operations.
func refMatch(routes []RouteSpec, names []string, in *RouteInput) int {
	for i, r := range routes {
		if refMatches(r, names, in) {
			return i
		}
	}
	return -1
}

var refRegexps = map[string]*regexp.Regexp{}

func refRegexp(re string) *regexp.Regexp {
	if refRegexps[re] == nil {
		refRegexps[re] = regexp.MustCompile("^(?:" + re + ")$")
	}
	return refRegexps[re]
}

func refMatches(r RouteSpec, names []string, in *RouteInput) bool {
	hostOK := func(cond string, raw []byte) bool {
		if cond == "" {
			return true
		}
		h := strings.ToLower(string(raw))
		if !strings.HasPrefix(h, "[") {
			h, _, _ = strings.Cut(h, ":")
		} else if end := strings.IndexByte(h, ']'); end > 0 {
			h = h[:end+1]
		}
		h = strings.TrimSuffix(h, ".")
		if a, err := netip.ParseAddr(strings.TrimSuffix(strings.TrimPrefix(h, "["), "]")); err == nil && strings.HasPrefix(h, "[") && strings.HasSuffix(h, "]") && a.Is6() && a.Zone() == "" {
			h = "[" + a.String() + "]"
		}
		if suffix, ok := strings.CutPrefix(cond, "*."); ok {
			return strings.HasSuffix(h, "."+suffix) && len(h) > len(suffix)+1
		}
		return h == cond
	}
	if !hostOK(r.Host, in.Host) || !hostOK(r.FromDomain, in.FromHost) {
		return false
	}
	if r.Prefix != "" && !bytes.HasPrefix(in.Path, []byte(r.Prefix)) {
		return false
	}
	if r.Regex != "" && (len(in.Path) > MaxRouteRegexInput || !refRegexp(r.Regex).Match(in.Path)) {
		return false
	}
	m := string(in.Method)
	if r.Method != "" && r.Method != m && !(r.Proto == "http" && r.Method == "GET" && m == "HEAD") {
		return false
	}
	if r.Header != "" {
		v := in.Headers[slices.Index(names, r.Header)]
		if v == nil || string(v) != r.HeaderValue {
			return false
		}
	}
	return true
}

// TestRouteTableAgainstReference: with 1,000 random routes, Match finds
// what a linear first-match scan finds, for random requests.
func TestRouteTableAgainstReference(t *testing.T) {
	for _, proto := range []string{"http", "sip"} {
		t.Run(proto, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(18, uint64(len(proto))))
			pick := func(xs ...string) string { return xs[rng.IntN(len(xs))] }
			hosts := []string{"a.example.com", "b.example.com", "example.com", "x.y.example.org", "*.example.com", "*.y.example.org", "*.example.org", "c.test"}
			var prefixes, regexes, methods []string
			if proto == "http" {
				prefixes = []string{"/", "/a", "/a/", "/a/b", "/api/", "/api/v1/", "/static/", "/s"}
				regexes = []string{"/a/[0-9]+", "/api/v[12]/.*", ".*\\.css", "/s.*"}
				methods = []string{"GET", "POST", "HEAD", "PUT"}
			} else {
				prefixes = []string{"+4420", "+442", "+44", "+1", "alice", "a"}
				regexes = []string{"\\+44[0-9]{4,6}", "[a-z]+", "\\+1.*"}
				methods = []string{"INVITE", "REGISTER", "OPTIONS", "MESSAGE"}
			}
			hostKey, pathKey := "host", "path"
			if proto == "sip" {
				hostKey, pathKey = "domain", "user"
			}
			// Every route has at least one condition, and half of them
			// a host of their own, so that late routes win too and some
			// requests match nothing.
			var routes []RouteSpec
			nregex := 0 // at most MaxRegexRoutes
			for i := range 1000 {
				parts := []string{fmt.Sprintf("pool=p%d", i%7)}
				switch rng.IntN(6) {
				case 0, 1:
					parts = append(parts, hostKey+"="+pick(hosts...))
				case 2:
					parts = append(parts, fmt.Sprintf("%s=h%d.example.net", hostKey, i))
				case 3:
					parts = append(parts, fmt.Sprintf("%s=*.w%d.example.net", hostKey, i))
				}
				switch rng.IntN(5) {
				case 0, 1:
					parts = append(parts, pathKey+"="+pick(prefixes...))
				case 2:
					if re := pick(regexes...); nregex < MaxRegexRoutes {
						parts = append(parts, pathKey+"=~"+re)
						nregex++
					}
				}
				if rng.IntN(3) == 0 {
					parts = append(parts, "method="+pick(methods...))
				}
				if rng.IntN(4) == 0 {
					parts = append(parts, "header="+pick("X-A", "x-b", "X-C")+":"+pick("1", "2"))
				}
				if proto == "sip" && rng.IntN(4) == 0 {
					parts = append(parts, "from-domain="+pick(hosts...))
				}
				if len(parts) == 1 {
					parts = append(parts, "method="+pick(methods...))
				}
				r, err := ParseRouteSpec(proto, strings.Join(parts, ","))
				if err != nil {
					t.Fatal(err)
				}
				routes = append(routes, r)
			}
			tab, err := NewRouteTable(proto, routes)
			if err != nil {
				t.Fatal(err)
			}
			names := tab.HeaderNames()
			inHosts := []string{"a.example.com", "A.Example.COM:8080", "b.example.com.", "example.com", "x.y.example.org", "z.x.y.example.org", "y.example.org", "c.test", "other.net", "badexample.com", ""}
			var inPaths []string
			if proto == "http" {
				inPaths = []string{"/", "/a", "/a/12", "/a/b/c", "/api/v1/x", "/api/v2/y", "/static/x.css", "/s", "/x.css", "/z", ""}
			} else {
				inPaths = []string{"+442079460000", "+442179460000", "+44123456", "+1555", "alice", "bob", "a", "+44", ""}
			}
			found := map[int]bool{}
			for range 20000 {
				host := pick(inHosts...)
				switch rng.IntN(3) {
				case 0:
					host = fmt.Sprintf("H%d.example.net", rng.IntN(1100))
				case 1:
					host = fmt.Sprintf("a.w%d.example.net:1", rng.IntN(1100))
				}
				in := &RouteInput{
					Host:     []byte(host),
					Path:     []byte(pick(inPaths...)),
					Method:   []byte(pick(append(methods, "DELETE")...)),
					FromHost: []byte(pick(inHosts...)),
				}
				for k := range names {
					if v := pick("1", "2", "3", ""); v != "" {
						in.Headers[k] = []byte(v)
					}
				}
				want := refMatch(routes, names, in)
				if got := tab.Match(in); got != want {
					t.Fatalf("Match(host %q path %q method %q from %q headers %q) = %d (%v), reference %d (%v)",
						in.Host, in.Path, in.Method, in.FromHost, in.Headers[:len(names)], got, specAt(tab, got), want, specAt(tab, want))
				}
				found[want] = true
			}
			t.Logf("%d distinct outcomes", len(found))
			// The inputs reached many routes, not only the first few.
			if late := slices.ContainsFunc(slices.Collect(maps.Keys(found)), func(i int) bool { return i > 100 }); len(found) < 20 || !late || !found[-1] {
				t.Errorf("the random inputs reached %d distinct outcomes (late route: %v, no match: %v): too few to compare", len(found), late, found[-1])
			}
		})
	}
}

// TestPrefixTree: prefixes given longest first split the tree's edges;
// every prefix of the path is found, the tree holds at most two nodes per
// prefix however long, and stripping allocates nothing.
func TestPrefixTree(t *testing.T) {
	long := "/" + strings.Repeat("x", MaxRouteValueLen-1)
	tab := mustTable(t, "http",
		"pool=a,path=/api/v1/users", // 0
		"pool=a,path=/api/v2",       // 1
		"pool=a,path=/api/",         // 2
		"pool=a,path=/a",            // 3
		"pool=a,path=/b",            // 4
		"pool=a,path="+long,         // 5
		"pool=a,path=/api/v1/users", // 6: shadowed
	)
	for _, tc := range []struct {
		path string
		want int
	}{
		{"/api/v1/users/7", 0},
		{"/api/v1/user", 2},
		{"/api/v2", 1},
		{"/api/v3", 2},
		{"/api", 3},
		{"/apple", 3},
		{"/b/c", 4},
		{"/c", -1},
		{"", -1},
		{long + "/y", 5},
		{long[:len(long)-1], -1},
	} {
		if got := tab.Match(input(tab, "", tc.path, "GET", "")); got != tc.want {
			t.Errorf("Match(%.20q) = %d, want %d", tc.path, got, tc.want)
		}
	}
	if n := len(tab.prefix.nodes); n > 2*tab.Len()+1 {
		t.Errorf("%d nodes for %d prefixes", n, tab.Len())
	}
	path := []byte("/static/a.css")
	if n := testing.AllocsPerRun(100, func() { StripPrefix(path, "/static") }); n != 0 {
		t.Errorf("StripPrefix allocates %v", n)
	}
}

// FuzzRouteMatch: whatever a client sends, Match neither panics nor
// differs from the linear reference.
func FuzzRouteMatch(f *testing.F) {
	f.Add("A.b.Example.COM.:80", "/a/12", "HEAD", "gw.carrier.net", "1")
	f.Add("[2001:db8::1]:8080", "/static/x", "GET", "", "")
	f.Add("[", ":", "", ".", "\x00")
	specs := map[string][]string{
		"http": {"pool=a,host=*.example.com,path=~/a/[0-9]+", "pool=b,host=[2001:db8::1]", "pool=c,path=/static/,method=GET", "pool=d,header=X-A:1,host=x.org"},
		"sip":  {"pool=a,domain=*.example.com,user=+4420", "pool=b,from-domain=*.carrier.net,method=INVITE", "pool=c,user=~[0-9]+", "pool=d,header=X-A:1"},
	}
	tabs := map[string]*RouteTable{}
	for proto, ss := range specs {
		tabs[proto] = mustTable(f, proto, ss...)
	}
	f.Fuzz(func(t *testing.T, host, path, method, from, header string) {
		for proto, tab := range tabs {
			in := &RouteInput{Host: []byte(host), Path: []byte(path), Method: []byte(method), FromHost: []byte(from)}
			if header != "" {
				in.Headers[0] = []byte(header)
			}
			var routes []RouteSpec
			for i := range tab.Len() {
				routes = append(routes, tab.Spec(i))
			}
			if got, want := tab.Match(in), refMatch(routes, tab.HeaderNames(), in); got != want {
				t.Fatalf("%s Match(%q %q %q %q %q) = %d, reference %d", proto, host, path, method, from, header, got, want)
			}
		}
	})
}

// TestMatchConcurrent: Match from many goroutines counts every hit (run
// with -race).
func TestMatchConcurrent(t *testing.T) {
	tab := mustTable(t, "sip", "pool=a,user=+44", "pool=b")
	done := make(chan struct{})
	for range 4 {
		go func() {
			defer func() { done <- struct{}{} }()
			for j := range 1000 {
				user := "+4420"
				if j%2 == 1 {
					user = "+33"
				}
				tab.Match(&RouteInput{Path: []byte(user), Method: []byte("INVITE")})
			}
		}()
	}
	for range 4 {
		<-done
	}
	if tab.Hits(0) != 2000 || tab.Hits(1) != 2000 {
		t.Errorf("Hits = %d, %d; want 2000, 2000", tab.Hits(0), tab.Hits(1))
	}
}
