package accesslog

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

var t0 = time.Date(2026, 12, 1, 14, 2, 3, 456789000, time.UTC)

// outcomes are one HTTP record per outcome the issue names.
func httpOutcomes() []struct {
	name string
	r    HTTPRecord
} {
	base := HTTPRecord{
		Start: t0, Client: netip.MustParseAddrPort("192.0.2.7:53144"),
		Method: []byte("GET"), Host: []byte("shop.example"), Path: []byte("/cart"),
		Query: []byte("id=7&token=secret"), Proto: "HTTP/1.1", Pool: "api", Route: "api",
		Class: ClassNew, RequestID: []byte("0123456789abcdef0123456789abcdef"),
		UserAgent: []byte("curl/8.5"), BytesIn: 78,
		HeadRead: 120 * time.Microsecond,
	}
	tid, pid, fl, _ := ParseTraceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	type oc = struct {
		name string
		r    HTTPRecord
	}
	var out []oc
	add := func(name string, f func(r *HTTPRecord)) {
		r := base
		f(&r)
		out = append(out, oc{name, r})
	}
	add("admitted", func(r *HTTPRecord) {
		r.Status, r.BytesOut, r.Backend = 200, 1432, "10.0.0.2:8080"
		r.Connect, r.FirstByte, r.Total = 300*time.Microsecond, 2100*time.Microsecond, 2500*time.Microsecond
		r.TraceID, r.ParentSpan, r.TraceFlags, r.HasTrace = tid, pid, fl, true
		r.Forwarded = netip.MustParseAddr("203.0.113.9")
		r.TLSVersion, r.SNI, r.Proto = 0x0304, []byte("shop.example"), "HTTP/2.0"
	})
	add("delayed", func(r *HTTPRecord) {
		r.Status, r.BytesOut, r.Backend, r.Decision = 200, 10, "10.0.0.2:8080", Delayed
		r.Reason = []byte("arm rule api-burst pool api")
		r.AdmissionWait, r.Connect, r.FirstByte, r.Total = 250*time.Millisecond, 251*time.Millisecond, 260*time.Millisecond, 261*time.Millisecond
	})
	for _, ref := range []struct{ name, reason string }{
		{"refused_memory", "memory state lower"},
		{"refused_arm", "arm rule api-burst pool api"},
		{"refused_mop", "mop pool api"},
		{"refused_draining", "draining"},
		{"refused_no_route", "no route"},
	} {
		add(ref.name, func(r *HTTPRecord) {
			r.Status, r.BytesOut, r.Decision, r.End = 503, 120, Refused, EndRefused
			if ref.name == "refused_arm" {
				r.Status = 429
			}
			if ref.name == "refused_no_route" {
				r.Status, r.Pool, r.Route = 404, "", ""
			}
			r.Reason, r.Total = []byte(ref.reason), 150*time.Microsecond
		})
	}
	add("retried", func(r *HTTPRecord) {
		r.Status, r.BytesOut, r.Backend = 200, 55, "10.0.0.3:8080"
		r.Retries, r.RetryBackends = 1, [MaxRetries]string{"10.0.0.2:8080"}
		r.Connect, r.FirstByte, r.Total = 1*time.Millisecond, 3*time.Millisecond, 3*time.Millisecond
	})
	add("client_abort", func(r *HTTPRecord) {
		r.Status, r.BytesOut, r.Backend, r.End = 200, 4096, "10.0.0.2:8080", EndClientAbort
		r.Connect, r.FirstByte, r.Total = 1*time.Millisecond, 2*time.Millisecond, 9*time.Millisecond
		r.Class = ClassAffinity
	})
	add("backend_timeout", func(r *HTTPRecord) {
		r.Status, r.BytesOut, r.Backend, r.End = 504, 90, "10.0.0.2:8080", EndTimeout
		r.Connect, r.Total = 1*time.Millisecond, 30*time.Second
		r.Path, r.UserAgent = []byte("/a \"b\"\n\xff"), []byte("evil\"agent\\")
	})
	return out
}

func sipOutcomes() []struct {
	name string
	r    SIPRecord
} {
	base := SIPRecord{
		Start: t0, Method: "INVITE", RURI: "sip:alice@example.com;transport=udp", CallID: "a84b4c76e66710@pc33",
		FromTag: "1928301774", CSeq: 314159, Transport: "udp",
		Source: netip.MustParseAddrPort("198.51.100.4:5060"), Pool: "default",
	}
	type oc = struct {
		name string
		r    SIPRecord
	}
	var out []oc
	add := func(name string, f func(r *SIPRecord)) {
		r := base
		f(&r)
		out = append(out, oc{name, r})
	}
	add("admitted", func(r *SIPRecord) {
		r.Backend, r.Status, r.ToTag = "10.0.1.2:5060", 200, "a6c85cf"
		r.Provisional, r.Final = 20*time.Millisecond, 1500*time.Millisecond
	})
	add("failover", func(r *SIPRecord) {
		r.Backend, r.Status = "10.0.1.3:5060", 200
		r.Failovers, r.FailoverBackends = 1, [MaxRetries]string{"10.0.1.2:5060"}
		r.Provisional, r.Final = 40*time.Millisecond, 900*time.Millisecond
	})
	add("local_503", func(r *SIPRecord) {
		r.Status, r.StatusFrom, r.Decision, r.Reason = 503, BySluice, Refused, "memory state lower"
	})
	add("local_408", func(r *SIPRecord) {
		r.Backend, r.Status, r.StatusFrom, r.Final = "10.0.1.2:5060", 408, BySluice, 32*time.Second
	})
	add("local_480", func(r *SIPRecord) {
		r.Status, r.StatusFrom, r.Reason = 480, BySluice, "no backend"
	})
	add("dialog_end", func(r *SIPRecord) {
		r.Kind, r.Method, r.Backend, r.Status, r.ToTag = SIPDialogEnd, "BYE", "10.0.1.2:5060", 200, "a6c85cf"
		r.Class, r.Duration, r.ByeSide = ClassAffinity, 95*time.Second, "callee"
	})
	return out
}

// TestGoldenLines: every format and outcome against testdata/*.golden;
// go test -run Golden -update rewrites them (review the diff).
func TestGoldenLines(t *testing.T) {
	for _, f := range []Format{JSON, Logfmt, Combined} {
		for _, opt := range []struct {
			suffix      string
			query, mask bool
		}{{"", false, false}, {"_query_mask", true, true}} {
			l := &Logger{opts: Options{Format: f, Query: opt.query, MaskUser: opt.mask}}
			var got bytes.Buffer
			for _, oc := range httpOutcomes() {
				got.WriteString("http " + oc.name + ": ")
				got.Write(l.formatHTTP(nil, &oc.r))
				got.WriteByte('\n')
			}
			for _, oc := range sipOutcomes() {
				got.WriteString("sip " + oc.name + ": ")
				got.Write(l.formatSIP(nil, &oc.r))
				got.WriteByte('\n')
			}
			name := filepath.Join("testdata", f.String()+opt.suffix+".golden")
			if *update {
				os.MkdirAll("testdata", 0o755)
				if err := os.WriteFile(name, got.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(name)
			if err != nil {
				t.Fatalf("%v (run with -update once)", err)
			}
			if !bytes.Equal(got.Bytes(), want) {
				t.Errorf("%s differs:\n got:\n%s\nwant:\n%s", name, got.Bytes(), want)
			}
			if f == JSON {
				sc := bufio.NewScanner(&got)
				for sc.Scan() {
					_, obj, _ := strings.Cut(sc.Text(), ": ")
					var m map[string]any
					if err := json.Unmarshal([]byte(obj), &m); err != nil {
						t.Errorf("not one JSON object: %v: %s", err, obj)
					}
				}
			}
		}
	}
}

func TestParseTraceparent(t *testing.T) {
	for _, tc := range []struct {
		in    string
		ok    bool
		flags byte
	}{
		{"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", true, 1},
		{"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00", true, 0},
		{"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra", true, 1},
		{"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra", false, 0},
		{"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", false, 0},
		{"00-00000000000000000000000000000000-00f067aa0ba902b7-01", false, 0},
		{"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", false, 0},
		{"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", false, 0},
		{"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0", false, 0},
		{"00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", false, 0},
		{"", false, 0},
	} {
		tid, pid, fl, ok := ParseTraceparent(tc.in)
		if ok != tc.ok || fl != tc.flags {
			t.Errorf("%q: ok=%v flags=%d, want %v %d", tc.in, ok, fl, tc.ok, tc.flags)
		}
		if ok2 := func() bool { _, _, _, ok := ParseTraceparentBytes([]byte(tc.in)); return ok }(); ok2 != ok {
			t.Errorf("%q: the bytes parser disagrees", tc.in)
		}
		if ok && tc.in[:2] == "00" && FormatTraceparent(tid, pid, fl) != tc.in {
			t.Errorf("%q: formatted back as %q", tc.in, FormatTraceparent(tid, pid, fl))
		}
	}
}

func TestParseSample(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Sample
		err  string
	}{
		{"", DefaultSample, ""},
		{"refused=1,new=1,affinity=0.01", Sample{1, 1, 0.01}, ""},
		{"new=0", Sample{1, 0, 1}, ""},
		{"new=2", Sample{}, `rate "2" of new: want a number from 0 to 1`},
		{"new=NaN", Sample{}, `rate "NaN"`},
		{"old=1", Sample{}, `class "old"`},
		{"new", Sample{}, `is not CLASS=RATE`},
	} {
		got, err := ParseSample(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), "-access-log-sample") {
				t.Errorf("%q: err %v, want one with %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%q: %+v %v, want %+v", tc.in, got, err, tc.want)
		}
	}
}

func TestParseDest(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want DestSpec
		err  string
	}{
		{"", DestSpec{Kind: DestOff}, ""},
		{"off", DestSpec{Kind: DestOff}, ""},
		{"-", DestSpec{Kind: DestStdout}, ""},
		{"/var/log/sluice/access.log", DestSpec{Kind: DestFile, Path: "/var/log/sluice/access.log"}, ""},
		{"syslog://127.0.0.1:514", DestSpec{Kind: DestSyslogUDP, Addr: "127.0.0.1:514", Facility: 16}, ""},
		{"syslog+udp://[::1]:514?facility=local3", DestSpec{Kind: DestSyslogUDP, Addr: "[::1]:514", Facility: 19}, ""},
		{"syslog+tcp://logs.example:514", DestSpec{Kind: DestSyslogTCP, Addr: "logs.example:514", Facility: 16}, ""},
		{"syslog+unix:///dev/log", DestSpec{Kind: DestSyslogUnix, Path: "/dev/log", Facility: 16}, ""},
		{"syslog://127.0.0.1", DestSpec{}, "HOST:PORT"},
		{"syslog://127.0.0.1:0", DestSpec{}, "port"},
		{"syslog+unix://dev/log", DestSpec{}, "three slashes"},
		{"syslog+tcp://h:1?facility=mail2", DestSpec{}, "facility"},
		{"syslog+tcp://h:1?facilty=local3", DestSpec{}, `query parameter "facilty": the only one known is facility`},
		{"syslog://h:1?facility=local1&x=1", DestSpec{}, `query parameter "x"`},
		{"http://x", DestSpec{}, "scheme"},
	} {
		got, err := ParseDest(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: err %v, want one with %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%q: %+v %v, want %+v", tc.in, got, err, tc.want)
		}
	}
	_, err := New(Options{Dest: "syslog://x", Sample: DefaultSample})
	if err == nil || !strings.Contains(err.Error(), `-access-log "syslog://x"`) {
		t.Errorf("New's error %v does not name the flag and value", err)
	}
	_, err = New(Options{Dest: "-", SIPDest: "/nonexistent/dir/x.log", Sample: DefaultSample})
	if err == nil || !strings.Contains(err.Error(), `-sip-access-log "/nonexistent/dir/x.log"`) {
		t.Errorf("New's error %v does not name the flag and value", err)
	}
}

func TestMaskUser(t *testing.T) {
	for in, want := range map[string]string{
		"sip:alice@example.com;transport=udp":                "sip:*@example.com;transport=udp",
		"sips:+4930123@gw.example":                           "sips:*@gw.example",
		"sip:example.com":                                    "sip:example.com",
		"tel:+1-201-555-0123;phone-context=x":                "tel:*;phone-context=x",
		"sip:a;b=c@d":                                        "sip:*@d",
		"sip:+358-555-1234567;postd=pp22@foo.com;user=phone": "sip:*@foo.com;user=phone",
		"sip:alice;x=y@127.0.0.1":                            "sip:*@127.0.0.1",
		"sip:alice:secret@host":                              "sip:*@host",
		"sip:*@host":                                         "sip:*@host",
		"TEL:+1":                                             "TEL:*",
		"sip:host;maddr=x":                                   "sip:host;maddr=x",
		"nonsense":                                           "nonsense",
	} {
		if got := string(maskUser(nil, in)); got != want {
			t.Errorf("%q: %q, want %q", in, got, want)
		}
		if got := MaskUser(in); got != want {
			t.Errorf("MaskUser(%q): %q, want %q", in, got, want)
		}
	}
}
