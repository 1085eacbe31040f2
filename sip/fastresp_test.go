package sip

import (
	"bytes"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	gosip "github.com/emiago/sipgo/sip"
)

// fastResp is a response as a backend answering through the balancer
// sends it, our Via on top: what the fast path is for.
const fastResp = "SIP/2.0 180 Ringing\r\n" +
	"Via: SIP/2.0/UDP 127.0.0.1:5060;branch=z9hG4bKsl-abc\r\n" +
	"Via: SIP/2.0/UDP 127.0.0.1:5061;branch=z9hG4bK-4242-1-1INVITE;received=127.0.0.1;rport=5061\r\n" +
	"From: sipp <sip:sipp@127.0.0.1>;tag=4242SIPpTag001\r\n" +
	"To: service <sip:service@127.0.0.1>;tag=4243SIPpTag011\r\n" +
	"Call-ID: 1-4242@127.0.0.1\r\n" +
	"CSeq: 1 INVITE\r\n" +
	"Record-Route: <sip:127.0.0.1:5060;lr;sl=AAAA>\r\n" +
	"Contact: <sip:127.0.0.1:5071;transport=UDP>\r\n" +
	"Content-Length: 0\r\n\r\n"

// sipp200 is a 200 as SIPp's uas_rr sends it back through the balancer
// (captured): [last_Via:] joins the Vias on one line, Content-Length is
// padded.
const sipp200 = "SIP/2.0 200 OK\r\n" +
	"Via: SIP/2.0/UDP 127.0.0.1:5060;branch=z9hG4bKslu0123456789abcdef, SIP/2.0/UDP 127.0.0.1:5061;branch=z9hG4bK-1-1-0;received=127.0.0.1;rport=5061\r\n" +
	"Record-Route: <sip:127.0.0.1:5060;lr;sl=TOKEN>\r\n" +
	"From: sipp <sip:sipp@127.0.0.1:5061>;tag=1SIPpTag001\r\n" +
	`To: "service" <sip:service@127.0.0.1:5060>;tag=25257SIPpTag011` + "\r\n" +
	"Call-ID: 1-1@127.0.0.1\r\nCSeq: 1 INVITE\r\n" +
	"Contact: <sip:127.0.0.1:17999;transport=UDP>\r\n" +
	"Content-Type: application/sdp\r\n" +
	"Content-Length:   129\r\n\r\n" +
	"v=0\r\no=user1 53655765 2353687637 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\nm=audio 6000 RTP/AVP 0\r\na=rtpmap:0 PCMU/8000\r\n"

// fastRespVectors are responses the fast path must take (true) or leave
// to sipgo (false): the forms it is certain of, and the ones a scanner
// could read differently from sipgo (folding, compact forms, duplicates,
// odd spacing, several Vias a line, framing), which it must decline.
var fastRespVectors = []struct {
	name string
	msg  string
	take bool
}{
	{"sipp 180", fastResp, true},
	{"quoted display name", strings.Replace(fastResp, "To: service <", `To: "service" <`, 1), true},
	{"no display name", strings.Replace(fastResp, "To: service <", "To: <", 1), true},
	{"two-word display name", strings.Replace(fastResp, "To: service <", "To: Bob Smith <", 1), true},
	{"display name without space", strings.Replace(fastResp, "To: service <", "To: service<", 1), true},
	{"body", strings.Replace(fastResp, "Content-Length: 0\r\n\r\n", "Content-Length: 4\r\n\r\nv=0\n", 1), true},
	{"rfc 2543 client via", strings.Replace(fastResp, "branch=z9hG4bK-4242-1-1INVITE;", "", 1), true},
	{"one via", strings.Replace(fastResp, "Via: SIP/2.0/UDP 127.0.0.1:5061;branch=z9hG4bK-4242-1-1INVITE;received=127.0.0.1;rport=5061\r\n", "", 1), true},
	{"compact via", strings.Replace(fastResp, "Via: SIP/2.0/UDP 127.0.0.1:5060", "v: SIP/2.0/UDP 127.0.0.1:5060", 1), false},
	{"lower-case via", strings.Replace(fastResp, "Via: SIP/2.0/UDP 127.0.0.1:5060", "via: SIP/2.0/UDP 127.0.0.1:5060", 1), false},
	{"compact call-id", strings.Replace(fastResp, "Call-ID:", "i:", 1), false},
	{"call-id case", strings.Replace(fastResp, "Call-ID:", "Call-Id:", 1), false},
	{"compact content-length", strings.Replace(fastResp, "Content-Length:", "l:", 1), false},
	{"compact to", strings.Replace(fastResp, "To:", "t:", 1), false},
	{"compact from", strings.Replace(fastResp, "From:", "f:", 1), true},
	{"two vias in a line", strings.Replace(fastResp, "branch=z9hG4bKsl-abc\r\nVia: ", "branch=z9hG4bKsl-abc, ", 1), true},
	{"three vias in a line", strings.Replace(fastResp, "branch=z9hG4bKsl-abc\r\nVia: ", "branch=z9hG4bKsl-abc, SIP/2.0/UDP 192.0.2.1;branch=z9hG4bKx, ", 1), true},
	{"two vias in a line without space", strings.Replace(fastResp, "branch=z9hG4bKsl-abc\r\nVia: ", "branch=z9hG4bKsl-abc,", 1), false},
	{"two vias in a line two spaces", strings.Replace(fastResp, "branch=z9hG4bKsl-abc\r\nVia: ", "branch=z9hG4bKsl-abc,  ", 1), false},
	{"via without params before a comma", strings.Replace(fastResp, "Via: SIP/2.0/UDP 127.0.0.1:5060;branch=z9hG4bKsl-abc\r\nVia: ", "Via: SIP/2.0/UDP 127.0.0.1:5060, ", 1), false},
	{"sipp 200", sipp200, true},
	{"padded content-length", strings.Replace(fastResp, "Content-Length: 0", "Content-Length:     0", 1), true},
	{"folded line", strings.Replace(fastResp, "CSeq: 1 INVITE\r\n", "CSeq: 1\r\n INVITE\r\n", 1), false},
	{"tab", strings.Replace(fastResp, "CSeq: 1 INVITE", "CSeq: 1\tINVITE", 1), false},
	{"two spaces after colon", strings.Replace(fastResp, "Call-ID: 1", "Call-ID:  1", 1), true},
	{"spaces after colon of a generic header", strings.Replace(fastResp, "Contact: <", "Contact:    <", 1), true},
	{"no space after colon", strings.Replace(fastResp, "Call-ID: 1", "Call-ID:1", 1), false},
	{"space before colon", strings.Replace(fastResp, "Call-ID: 1", "Call-ID : 1", 1), false},
	{"trailing space", strings.Replace(fastResp, "Call-ID: 1-4242@127.0.0.1", "Call-ID: 1-4242@127.0.0.1 ", 1), false},
	{"two content-lengths", strings.Replace(fastResp, "Content-Length: 0\r\n", "Content-Length: 0\r\nContent-Length: 0\r\n", 1), false},
	{"content-length and l", strings.Replace(fastResp, "Content-Length: 0\r\n", "l: 0\r\nContent-Length: 0\r\n", 1), false},
	{"two to", strings.Replace(fastResp, "Call-ID:", "To: <sip:x@y>;tag=b\r\nCall-ID:", 1), false},
	{"two from", strings.Replace(fastResp, "Call-ID:", "f: <sip:x@y>;tag=b\r\nCall-ID:", 1), false},
	{"two call-ids", strings.Replace(fastResp, "CSeq:", "Call-ID: other\r\nCSeq:", 1), false},
	{"two cseqs", strings.Replace(fastResp, "Call-ID:", "CSeq: 2 BYE\r\nCall-ID:", 1), false},
	{"leading zero content-length", strings.Replace(fastResp, "Content-Length: 0", "Content-Length: 00", 1), false},
	{"body longer than content-length", strings.Replace(fastResp, "\r\n\r\n", "\r\n\r\nX", 1), false},
	{"body shorter than content-length", strings.Replace(fastResp, "Content-Length: 0", "Content-Length: 5", 1), false},
	{"no content-length", strings.Replace(fastResp, "Content-Length: 0\r\n", "", 1), false},
	{"leading zero cseq", strings.Replace(fastResp, "CSeq: 1 ", "CSeq: 01 ", 1), false},
	{"signed cseq", strings.Replace(fastResp, "CSeq: 1 ", "CSeq: +1 ", 1), false},
	{"lower-case method", strings.Replace(fastResp, "1 INVITE", "1 invite", 1), false},
	{"leading zero via port", strings.Replace(fastResp, "127.0.0.1:5060;", "127.0.0.1:05060;", 1), false},
	{"ipv6 via", strings.Replace(fastResp, "127.0.0.1:5061;branch", "[::1]:5061;branch", 1), false},
	{"quoted via param", strings.Replace(fastResp, "rport=5061", `rport="5061"`, 1), false},
	{"empty via param value", strings.Replace(fastResp, "rport=5061", "rport=", 1), false},
	{"duplicate via param", strings.Replace(fastResp, "rport=5061", "rport=5061;rport=1", 1), false},
	{"via param with space", strings.Replace(fastResp, ";received=", " ;received=", 1), false},
	{"lower-case transport", strings.Replace(fastResp, "SIP/2.0/UDP 127.0.0.1:5060", "SIP/2.0/udp 127.0.0.1:5060", 1), false},
	{"lf only", strings.ReplaceAll(fastResp, "\r\n", "\n"), false},
	{"bare cr", strings.Replace(fastResp, "CSeq: 1 INVITE", "CSeq: 1 INV\rITE", 1), false},
	{"nul", strings.Replace(fastResp, "Call-ID: 1", "Call-ID: \x001", 1), false},
	{"utf-8", strings.Replace(fastResp, "Ringing", "Ringing \u00e9", 1), false},
	{"to without brackets", strings.Replace(fastResp, "To: service <sip:service@127.0.0.1>;tag=", "To: sip:service@127.0.0.1;tag=", 1), false},
	{"to upper-case scheme", strings.Replace(fastResp, "<sip:service@", "<SIP:service@", 1), false},
	{"to uri header", strings.Replace(fastResp, "<sip:service@127.0.0.1>", "<sip:service@127.0.0.1?x=y>", 1), false},
	{"to escaped user", strings.Replace(fastResp, "<sip:service@", "<sip:s%41@", 1), false},
	{"to quoted display with escape", strings.Replace(fastResp, "To: service <", `To: "a\"b" <`, 1), false},
	{"to junk after quote", strings.Replace(fastResp, "To: service <", `To: "a"x <`, 1), false},
	{"to two spaces in display", strings.Replace(fastResp, "To: service <", "To: a  b <", 1), false},
	{"to tag twice", strings.Replace(fastResp, ";tag=4243SIPpTag011", ";tag=a;tag=b", 1), false},
	{"to empty tag", strings.Replace(fastResp, ";tag=4243SIPpTag011", ";tag=", 1), false},
	{"to before via", "SIP/2.0 180 Ringing\r\nTo: <sip:a@b>;tag=x\r\n" + strings.SplitN(fastResp, "\r\n", 2)[1], false},
	{"max-forwards", strings.Replace(fastResp, "Call-ID:", "Max-Forwards: 70\r\nCall-ID:", 1), false},
	{"route", strings.Replace(fastResp, "Call-ID:", "Route: <sip:x>\r\nCall-ID:", 1), false},
	{"status 100", strings.Replace(fastResp, "180 Ringing", "100 Trying", 1), true},
	{"status 099", strings.Replace(fastResp, "180 Ringing", "099 X", 1), false},
	{"status 700", strings.Replace(fastResp, "180 Ringing", "700 X", 1), false},
	{"empty reason", strings.Replace(fastResp, "180 Ringing", "180 ", 1), false},
	{"version", strings.Replace(fastResp, "SIP/2.0 180", "SIP/3.0 180", 1), false},
	{"request", strings.Replace(fastResp, "SIP/2.0 180 Ringing", "BYE sip:a@b SIP/2.0", 1), false},
	{"empty header value", strings.Replace(fastResp, "Call-ID:", "Subject:\r\nCall-ID:", 1), false},
	{"no end of head", strings.TrimSuffix(fastResp, "\r\n"), false},
}

func TestScanResponseVectors(t *testing.T) {
	for _, v := range fastRespVectors {
		t.Run(v.name, func(t *testing.T) {
			var sc respScan
			got := scanResponse([]byte(v.msg), &sc)
			if got != v.take {
				t.Fatalf("scanResponse = %v, want %v for\n%q", got, v.take, v.msg)
			}
			checkFastResponse(t, []byte(v.msg))
		})
	}
}

// TestScanResponseWire is the relayed form of the SIPp 180, golden: our
// Via gone, the To display name quoted as sipgo writes it, the rest as
// received.
func TestScanResponseWire(t *testing.T) {
	var sc respScan
	if !scanResponse([]byte(fastResp), &sc) {
		t.Fatal("declined")
	}
	want := "SIP/2.0 180 Ringing\r\n" +
		"Via: SIP/2.0/UDP 127.0.0.1:5061;branch=z9hG4bK-4242-1-1INVITE;received=127.0.0.1;rport=5061\r\n" +
		"From: sipp <sip:sipp@127.0.0.1>;tag=4242SIPpTag001\r\n" +
		`To: "service" <sip:service@127.0.0.1>;tag=4243SIPpTag011` + "\r\n" +
		"Call-ID: 1-4242@127.0.0.1\r\n" +
		"CSeq: 1 INVITE\r\n" +
		"Record-Route: <sip:127.0.0.1:5060;lr;sl=AAAA>\r\n" +
		"Contact: <sip:127.0.0.1:5071;transport=UDP>\r\n" +
		"Content-Length: 0\r\n\r\n"
	if got := string(sc.appendWire(nil, []byte(fastResp))); got != want {
		t.Fatalf("wire\n%q\nwant\n%q", got, want)
	}
	if sc.code != 180 || string(sc.method) != "INVITE" || sc.seq != 1 || string(sc.callID) != "1-4242@127.0.0.1" ||
		tagParam(string(sc.fromVal)) != "4242SIPpTag001" || string(sc.toTag) != "4243SIPpTag011" || sc.nvia != 2 ||
		string(sc.vias[0].branch) != "z9hG4bKsl-abc" || string(sc.vias[1].received) != "127.0.0.1" || string(sc.vias[1].rport) != "5061" {
		t.Fatalf("fields %+v", sc)
	}
}

// checkFastResponse fails t if the fast path takes data and sipgo's path
// would read it differently: any field routeResponse decides on, or the
// bytes relayed. A message the fast path declines passes.
func checkFastResponse(t *testing.T, data []byte) {
	t.Helper()
	var sc respScan
	if !scanResponse(data, &sc) {
		return
	}
	m, err := newParser().ParseSIP(append([]byte(nil), data...))
	if err != nil {
		t.Fatalf("fast path takes what sipgo refuses (%v):\n%q", err, data)
	}
	res, ok := m.(*gosip.Response)
	if !ok {
		t.Fatalf("fast path takes a request:\n%q", data)
	}
	if i := ctlInHead(data); i >= 0 {
		t.Fatalf("fast path takes a control character at %d:\n%q", i, data)
	}
	if d := duplicated(res); d != "" {
		t.Fatalf("fast path takes two %s:\n%q", d, data)
	}
	v := res.Via()
	if v == nil || res.CSeq() == nil || res.CallID() == nil {
		t.Fatalf("fast path takes a response without Via, CSeq or Call-ID:\n%q", data)
	}
	top := &sc.vias[0]
	br, _ := v.Params.Get("branch")
	if br != string(top.branch) || v.Host != string(top.host) || v.Port != top.port {
		t.Fatalf("top Via: sipgo %q %q %d, fast path %q %q %d:\n%q", br, v.Host, v.Port, top.branch, top.host, top.port, data)
	}
	if res.StatusCode != sc.code || res.CSeq().MethodName != gosip.RequestMethod(sc.method) || res.CSeq().SeqNo != sc.seq ||
		res.CallID().Value() != string(sc.callID) || toTag(res) != string(sc.toTag) {
		t.Fatalf("fields: sipgo %d %s %d %q to-tag %q, fast path %d %s %d %q %q:\n%q", res.StatusCode, res.CSeq().MethodName,
			res.CSeq().SeqNo, res.CallID().Value(), toTag(res), sc.code, sc.method, sc.seq, sc.callID, sc.toTag, data)
	}
	var from string
	if f := header(res, "from", "f"); f != nil {
		from = tagParam(f.Value())
	}
	if ft := tagParam(string(sc.fromVal)); from != ft {
		t.Fatalf("From tag: sipgo %q, fast path %q:\n%q", from, ft, data)
	}
	res.RemoveHeader("Via")
	next := res.Via()
	if (next != nil) != (sc.nvia >= 2) {
		t.Fatalf("next Via: sipgo %v, fast path %d Vias:\n%q", next != nil, sc.nvia, data)
	}
	if next != nil {
		nv := &sc.vias[1]
		for _, p := range []struct {
			k   string
			v   []byte
			has bool
		}{{"branch", nv.branch, nv.hasBranch}, {"received", nv.received, nv.hasReceived}, {"rport", nv.rport, nv.hasRport}} {
			got, has := next.Params.Get(p.k)
			if got != string(p.v) || has != p.has {
				t.Fatalf("next Via %s: sipgo %q %v, fast path %q %v:\n%q", p.k, got, has, p.v, p.has, data)
			}
		}
		if next.Host != string(nv.host) || next.Port != nv.port {
			t.Fatalf("next Via: sipgo %q %d, fast path %q %d:\n%q", next.Host, next.Port, nv.host, nv.port, data)
		}
	}
	var b bytes.Buffer
	res.StringWrite(&b)
	if w := sc.appendWire(nil, data); !bytes.Equal(w, b.Bytes()) {
		t.Fatalf("relayed bytes differ:\nsipgo     %q\nfast path %q\nin        %q", b.Bytes(), w, data)
	}
}

// addFuzzCorpusSeeds adds the stored inputs of the package's other fuzz
// targets (testdata/fuzz/*), the hostile vectors they found, as seeds.
func addFuzzCorpusSeeds(f *testing.F) {
	files, _ := filepath.Glob("testdata/fuzz/*/*")
	for _, p := range files {
		raw, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		for _, line := range strings.Split(string(raw), "\n")[1:] {
			line = strings.TrimSpace(line)
			if !strings.HasPrefix(line, "[]byte(") || !strings.HasSuffix(line, ")") {
				continue
			}
			if s, err := strconv.Unquote(line[len("[]byte(") : len(line)-1]); err == nil {
				f.Add([]byte(s))
			}
		}
	}
}

// FuzzFastResponse is the differential test of the response fast path:
// whatever it takes, sipgo must parse to the same fields (the ones
// routeResponse decides on, which both paths share) and write back as the
// same bytes; it may decline anything.
//
//	go test -run '^$' -fuzz FuzzFastResponse -fuzztime 10m ./sip/
func FuzzFastResponse(f *testing.F) {
	addMessageSeeds(f)
	addFuzzCorpusSeeds(f)
	for _, v := range fastRespVectors {
		f.Add([]byte(v.msg))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		checkFastResponse(t, data)
	})
}

// fastReq is a client's BYE as SIPp's uac_rr sends it through the
// balancer at $LB, with our Route (and token $TOKEN) on top.
const fastReq = "BYE sip:127.0.0.1:5071;transport=UDP SIP/2.0\r\n" +
	"Via: SIP/2.0/UDP 127.0.0.1:5061;branch=z9hG4bK-4242-1-2BYE\r\n" +
	"From: sipp <sip:sipp@127.0.0.1>;tag=4242SIPpTag001\r\n" +
	"To: service <sip:service@127.0.0.1>;tag=4243SIPpTag011\r\n" +
	"Call-ID: 1-4242@127.0.0.1\r\n" +
	"CSeq: 2 BYE\r\n" +
	"Route: <sip:$LB;lr;sl=$TOKEN>\r\n" +
	"Contact: sip:sipp@127.0.0.1\r\n" +
	"Max-Forwards: 70\r\n" +
	"Subject: Performance Test\r\n" +
	"Content-Length: 0\r\n\r\n"

// fastReqVectors are in-dialog requests the scan must take or decline.
var fastReqVectors = []struct {
	name string
	msg  string
	take bool
}{
	{"sipp bye", fastReq, true},
	{"sipp ack", strings.NewReplacer("BYE sip:", "ACK sip:", "2 BYE", "1 ACK", "2BYE", "1ACK").Replace(fastReq), true},
	{"two routes", strings.Replace(fastReq, "Route: <sip:$LB;lr;sl=$TOKEN>\r\n", "Route: <sip:$LB;lr;sl=$TOKEN>\r\nRoute: <sip:$LB;lr>\r\n", 1), true},
	{"route not ours below", strings.Replace(fastReq, "Route: <sip:$LB;lr;sl=$TOKEN>\r\n", "Route: <sip:$LB;lr;sl=$TOKEN>\r\nRoute: <sip:192.0.2.1:5060;lr>\r\n", 1), true},
	{"no max-forwards", strings.Replace(fastReq, "Max-Forwards: 70\r\n", "", 1), true},
	{"max-forwards 200", strings.Replace(fastReq, "Max-Forwards: 70", "Max-Forwards: 200", 1), true},
	{"max-forwards 1", strings.Replace(fastReq, "Max-Forwards: 70", "Max-Forwards: 1", 1), true},
	{"client rport", strings.Replace(fastReq, "2BYE\r\n", "2BYE;rport\r\n", 1), true},
	{"client received and rport", strings.Replace(fastReq, "2BYE\r\n", "2BYE;rport=9;x;received=192.0.2.9\r\n", 1), true},
	{"two client vias", strings.Replace(fastReq, "2BYE\r\n", "2BYE\r\nVia: SIP/2.0/UDP 192.0.2.7;branch=z9hG4bKx\r\n", 1), true},
	{"body", strings.Replace(fastReq, "Content-Length: 0\r\n\r\n", "Content-Length: 3\r\n\r\nabc", 1), true},
	{"max-forwards 0", strings.Replace(fastReq, "Max-Forwards: 70", "Max-Forwards: 0", 1), false},
	{"two max-forwards", strings.Replace(fastReq, "Max-Forwards: 70\r\n", "Max-Forwards: 70\r\nMax-Forwards: 5\r\n", 1), false},
	{"compact max-forwards", strings.Replace(fastReq, "Max-Forwards:", "max-forwards:", 1), false},
	{"two routes in a line", strings.Replace(fastReq, "Route: <sip:$LB;lr;sl=$TOKEN>", "Route: <sip:$LB;lr;sl=$TOKEN>,<sip:$LB;lr>", 1), false},
	{"route params outside", strings.Replace(fastReq, "Route: <sip:$LB;lr;sl=$TOKEN>", "Route: <sip:$LB;lr;sl=$TOKEN>;x=y", 1), false},
	{"route lower case", strings.Replace(fastReq, "Route:", "route:", 1), false},
	{"route user", strings.Replace(fastReq, "Route: <sip:$LB", "Route: <sip:u@$LB", 1), false},
	{"invite", strings.NewReplacer("BYE sip:", "INVITE sip:", "2 BYE", "2 INVITE").Replace(fastReq), false},
	{"cseq method differs", strings.Replace(fastReq, "2 BYE", "2 ACK", 1), false},
	{"sips uri", strings.Replace(fastReq, "BYE sip:", "BYE sips:", 1), false},
	{"no to-tag", strings.Replace(fastReq, ";tag=4243SIPpTag011", "", 1), false},
	{"no content-length", strings.Replace(fastReq, "Content-Length: 0\r\n", "", 1), false},
	{"two froms", strings.Replace(fastReq, "Call-ID:", "From: <sip:x@y>;tag=z\r\nCall-ID:", 1), false},
	{"version", strings.Replace(fastReq, " SIP/2.0\r\n", " SIP/2.1\r\n", 1), false},
	{"lower-case version", strings.Replace(fastReq, " SIP/2.0\r\n", " sip/2.0\r\n", 1), false},
	{"uri with space", strings.Replace(fastReq, "5071;transport=UDP SIP", "5071;transport=UDP  SIP", 1), false},
	{"folded", strings.Replace(fastReq, "Subject: Performance Test", "Subject: Performance\r\n Test", 1), false},
	{"alias contact", strings.Replace(fastReq, "Contact: sip:sipp@127.0.0.1", "Contact: <sip:sipp@127.0.0.1;ALIAS=x>", 1), true},
}

// inDialogServer is a started server and a token of its signer for the
// Call-ID of fastReq, naming backend b1.
func inDialogServer(t testing.TB) (*Server, func(string) string) {
	be := newUAS(t, "b1")
	be.drop.Store(true)
	be.mode.Store(modeSilent)
	s := testServer(t, []*uas{be}, nil, nil)
	token := s.signer.PoolToken("default", tokenSubject("b1", "1-4242@127.0.0.1"), time.Now().Add(time.Hour))
	r := strings.NewReplacer("$LB", s.udpAddr().String(), "$TOKEN", token)
	return s, r.Replace
}

func TestScanInDialogVectors(t *testing.T) {
	s, fill := inDialogServer(t)
	src := source{addr: netip.MustParseAddrPort("127.0.0.1:5061")}
	for _, v := range fastReqVectors {
		t.Run(v.name, func(t *testing.T) {
			msg := []byte(fill(v.msg))
			var rq reqScan
			if got := scanInDialog(msg, &rq); got != v.take {
				t.Fatalf("scanInDialog = %v, want %v for\n%q", got, v.take, msg)
			}
			checkFastInDialog(t, s, msg, src)
		})
	}
}

// TestFastInDialogWire is the forwarded form of the SIPp BYE, golden:
// our Via on top, the client's with received and rport, our Route gone,
// Max-Forwards one less, the To display name quoted.
func TestFastInDialogWire(t *testing.T) {
	s, fill := inDialogServer(t)
	msg := []byte(fill(fastReq))
	var rq reqScan
	if !scanInDialog(msg, &rq) {
		t.Fatal("declined")
	}
	got := string(rq.appendInDialogWire(nil, msg, []byte("Via: OURS\r\n"), netip.MustParseAddrPort("127.0.0.1:5061")))
	want := "BYE sip:127.0.0.1:5071;transport=UDP SIP/2.0\r\n" +
		"Via: OURS\r\n" +
		"Via: SIP/2.0/UDP 127.0.0.1:5061;branch=z9hG4bK-4242-1-2BYE;received=127.0.0.1;rport=5061\r\n" +
		"From: sipp <sip:sipp@127.0.0.1>;tag=4242SIPpTag001\r\n" +
		`To: "service" <sip:service@127.0.0.1>;tag=4243SIPpTag011` + "\r\n" +
		"Call-ID: 1-4242@127.0.0.1\r\n" +
		"CSeq: 2 BYE\r\n" +
		"Contact: sip:sipp@127.0.0.1\r\n" +
		"Max-Forwards: 69\r\n" +
		"Subject: Performance Test\r\n" +
		"Content-Length: 0\r\n\r\n"
	if got != want {
		t.Fatalf("wire\n%q\nwant\n%q", got, want)
	}
	_ = s
}

// checkFastInDialog fails t if the in-dialog scan takes data and sipgo's
// path would read it differently: the checks handleRequest makes before
// routing, the fields the routing and our branch are made of, which
// Routes are ours and the token, and the bytes forwarded.
func checkFastInDialog(t *testing.T, s *Server, data []byte, src source) {
	t.Helper()
	var rq reqScan
	if !scanInDialog(data, &rq) {
		return
	}
	m, err := newParser().ParseSIP(append([]byte(nil), data...))
	if err != nil {
		t.Fatalf("fast path takes what sipgo refuses (%v):\n%q", err, data)
	}
	req, ok := m.(*gosip.Request)
	if !ok {
		t.Fatalf("fast path takes a response:\n%q", data)
	}
	req.SetTransport("UDP")
	if i := ctlInHead(data); i >= 0 {
		t.Fatalf("fast path takes a control character at %d:\n%q", i, data)
	}
	if d := duplicated(req); d != "" {
		t.Fatalf("fast path takes two %s:\n%q", d, data)
	}
	if req.Via() == nil || req.CallID() == nil || req.CSeq() == nil || req.To() == nil || header(req, "from", "f") == nil ||
		req.CSeq().MethodName != req.Method || !strings.EqualFold(req.SipVersion, "SIP/2.0") || req.Recipient.Host == "" && req.Recipient.Raw() == "" {
		t.Fatalf("fast path takes what handleRequest refuses:\n%q", data)
	}
	if string(req.Method) != string(rq.method) || req.Recipient.String() != string(rq.uri) {
		t.Fatalf("request line: sipgo %s %q, fast path %s %q", req.Method, req.Recipient.String(), rq.method, rq.uri)
	}
	mf := req.MaxForwards()
	if (mf != nil) != rq.hasMF || mf != nil && (int(mf.Val()) != rq.mf || mf.Val() == 0) {
		t.Fatalf("Max-Forwards: sipgo %v, fast path %v %d:\n%q", mf, rq.hasMF, rq.mf, data)
	}
	if !rq.ourVia && s.looped(req) {
		t.Fatalf("fast path takes a loop:\n%q", data)
	}
	if !rq.alias && s.plantedAlias(req, src) {
		t.Fatalf("fast path takes a planted alias:\n%q", data)
	}
	var from string
	if f := header(req, "from", "f"); f != nil {
		from = tagParam(f.Value())
	}
	fromTag := tagParam(string(rq.fromVal))
	if req.CallID().Value() != string(rq.callID) || toTag(req) != string(rq.toTag) || from != fromTag || req.CSeq().SeqNo != rq.seq {
		t.Fatalf("fields: sipgo %q %q %q %d, fast path %q %q %q %d:\n%q", req.CallID().Value(), toTag(req), from, req.CSeq().SeqNo,
			rq.callID, rq.toTag, fromTag, rq.seq, data)
	}
	if a, b := loopHash(req), loopHashOf(rq.uri, string(rq.callID), true, fromTag, string(rq.toTag), rq.seq); a != b {
		t.Fatalf("loop hash: sipgo %x, fast path %x:\n%q", a, b, data)
	}
	if a, b := clientTxnOf(req, src).key(), clientTxnOfSentBy(string(rq.via.host), rq.via.port, string(rq.via.branch), src.addr, false, string(rq.callID), rq.seq).key(); a != b {
		t.Fatalf("client transaction: sipgo %q, fast path %q:\n%q", a, b, data)
	}
	var routes []*gosip.RouteHeader
	for _, h := range req.Headers() {
		if r, ok := h.(*gosip.RouteHeader); ok {
			routes = append(routes, r)
		}
	}
	if len(routes) != rq.nroute {
		t.Fatalf("Routes: sipgo %d, fast path %d:\n%q", len(routes), rq.nroute, data)
	}
	allOurs := rq.nroute > 0
	var token string
	for i, r := range routes {
		f := &rq.routes[i]
		ours := !f.transport && s.isOurs(&gosip.Uri{Scheme: "sip", Host: string(f.host), Port: f.port})
		if f.transport || ours != s.isOurs(&r.Address) {
			allOurs = false
			if !f.transport {
				t.Fatalf("Route %d ours: sipgo %v, fast path %v:\n%q", i, s.isOurs(&r.Address), ours, data)
			}
		}
		if !ours {
			allOurs = false
		}
		if token == "" && f.hasToken {
			token = string(f.token)
		}
	}
	if !allOurs {
		return // the fast path declines it
	}
	gotToken, had := s.popOurRoutes(req)
	if !had || gotToken != token || req.Route() != nil {
		t.Fatalf("our Routes: sipgo token %q had %v left %v, fast path %q:\n%q", gotToken, had, req.Route(), token, data)
	}
	const br = "z9hG4bKslu0123456789abcdef0123456789abcdef"
	s.prepareForward(req, src)
	req.PrependHeader(s.ourVia(br, "UDP"))
	var slow bytes.Buffer
	req.StringWrite(&slow)
	fast := rq.appendInDialogWire(nil, data, s.appendOurVia(nil, br, "UDP"), src.addr)
	if !bytes.Equal(fast, slow.Bytes()) {
		t.Fatalf("forwarded bytes differ:\nsipgo     %q\nfast path %q\nin        %q", slow.Bytes(), fast, data)
	}
}

// FuzzFastInDialog is the differential test of the in-dialog fast path:
// whatever scanInDialog takes, sipgo must read the same way (checks,
// fields, Routes, token) and forward as the same bytes.
//
//	go test -run '^$' -fuzz FuzzFastInDialog -fuzztime 10m ./sip/
func FuzzFastInDialog(f *testing.F) {
	s, fill := inDialogServer(f)
	addMessageSeeds(f)
	addFuzzCorpusSeeds(f)
	for _, v := range fastReqVectors {
		f.Add([]byte(fill(v.msg)))
	}
	src := source{addr: netip.MustParseAddrPort("127.0.0.1:5061")}
	f.Fuzz(func(t *testing.T, data []byte) {
		checkFastInDialog(t, s, data, src)
	})
}

// TestFastInDialogAnswers: the answers of ours to a BYE the fast path
// forwarded are those the sipgo path gives: 503 "backend unreachable"
// when its send fails at the read batch's end (made from the request as
// forwarded: the client's Via with received and rport), and 408 when its
// backend stays silent (made from the request as received). Each BYE goes
// once through a server with the fast path and once through one without;
// what differs between the two servers (address, token) is masked.
func TestFastInDialogAnswers(t *testing.T) {
	bad := netip.MustParseAddrPort("[::1]:9") // an IPv6 backend on an IPv4 socket: every send fails
	silent := newUAS(t, "b1")
	silent.mode.Store(modeSilent)
	silent.drop.Store(true)
	for _, tc := range []struct {
		name    string
		backend netip.AddrPort
		code    int
	}{{"send fails", bad, 503}, {"backend silent", silent.addr, 408}} {
		t.Run(tc.name, func(t *testing.T) {
			answer := func(fast bool) string {
				s := startServer(t, serverOpts{backends: []netip.AddrPort{tc.backend}, mut: func(c *Config) {
					c.UDPSendBatch = true
					c.InDialogTimeout = 50 * time.Millisecond
				}})
				s.noFastPath = !fast
				c := newUAC(t, s.udpAddr())
				token := s.routeToken("default", tokenSubject("b1", "1-4242@127.0.0.1"), time.Now().Add(time.Hour))
				bye := strings.NewReplacer("$LB", s.udpAddr().String(), "$TOKEN", token, "127.0.0.1:5061", c.addr.String()).Replace(fastReq)
				s.udpOut.begin()
				s.udpDatagram([]byte(bye), c.addr)
				s.udpOut.end(s)
				res := c.recvResponse(tc.code)
				if got := s.metrics.FastPath.Load(); got != map[bool]uint64{true: 1, false: 0}[fast] {
					t.Errorf("fast path (on: %v) took %d messages", fast, got)
				}
				out := strings.NewReplacer(s.udpAddr().String(), "LB", c.addr.String(), "CLIENT",
					strconv.Itoa(int(c.addr.Port())), "CLIENTPORT").Replace(res.String())
				return retryAfterRE.ReplaceAllString(out, "Retry-After: N") // jittered

			}
			slow, fast := answer(false), answer(true)
			if slow != fast {
				t.Fatalf("answers differ:\nslow %q\nfast %q", slow, fast)
			}
		})
	}
}

var retryAfterRE = regexp.MustCompile(`Retry-After: [0-9]+`)
