package main

import (
	"slices"
	"testing"
)

// TestParseResponse: golden responses as sluice and Kamailio send them
// (one Record-Route header per entry, or several entries in one header;
// compact header names), and what is not a response.
func TestParseResponse(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   string
		ok   bool
		want response
	}{
		{"sluice 200", "SIP/2.0 200 OK\r\nVia: SIP/2.0/WSS w1.invalid;branch=z9hG4bKx\r\nRecord-Route: <sip:127.0.0.1:5060;lr;sl=AAA>\r\nRecord-Route: <sip:FLOW@127.0.0.1:4481;lr;transport=wss;sl=AAA>\r\nFrom: <sip:wsload@edge.test>;tag=wl1\r\nTo: <sip:service@edge.test>;tag=25289SIPpTag011\r\nCall-ID: a-1@wsload\r\nCSeq: 1 INVITE\r\nContact: <sip:127.0.0.1:5071;transport=UDP>\r\nContent-Length: 0\r\n\r\n", true,
			response{code: 200, method: "INVITE", callID: "a-1@wsload", toTag: "25289SIPpTag011", contact: "sip:127.0.0.1:5071;transport=UDP",
				recordRoutes: []string{"<sip:127.0.0.1:5060;lr;sl=AAA>", "<sip:FLOW@127.0.0.1:4481;lr;transport=wss;sl=AAA>"}}},
		{"kamailio one header, compact", "SIP/2.0 180 Ringing\r\ni: b-2@wsload\r\nRecord-Route: <sip:127.0.0.1:8091;transport=ws;r2=on;lr>, <sip:127.0.0.1;r2=on;lr>\r\nt: \"svc\" <sip:service@edge.test>;tag=x;foo\r\nm: sip:u@h;transport=udp\r\nCSeq: 1 INVITE\r\n\r\n", true,
			response{code: 180, method: "INVITE", callID: "b-2@wsload", toTag: "x", contact: "sip:u@h",
				recordRoutes: []string{"<sip:127.0.0.1:8091;transport=ws;r2=on;lr>", "<sip:127.0.0.1;r2=on;lr>"}}},
		{"request", "BYE sip:a@b SIP/2.0\r\nCall-ID: c\r\nCSeq: 2 BYE\r\n\r\n", false, response{}},
		{"keep-alive", "\r\n", false, response{}},
		{"bad code", "SIP/2.0 99 X\r\nCall-ID: c\r\nCSeq: 1 INVITE\r\n\r\n", false, response{}},
		{"no call-id", "SIP/2.0 200 OK\r\nCSeq: 1 INVITE\r\n\r\n", false, response{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, ok := parseResponse([]byte(tc.in))
			if ok != tc.ok {
				t.Fatalf("ok %v, want %v", ok, tc.ok)
			}
			if !ok {
				return
			}
			if r.code != tc.want.code || r.method != tc.want.method || r.callID != tc.want.callID || r.toTag != tc.want.toTag ||
				r.contact != tc.want.contact || !slices.Equal(r.recordRoutes, tc.want.recordRoutes) {
				t.Errorf("got %+v\nwant %+v", *r, tc.want)
			}
		})
	}
}

// TestRouteSet: the route set is the Record-Route entries reversed, and
// the 2xx's list is left as it was.
func TestRouteSet(t *testing.T) {
	rrs := []string{"<sip:backend-facing;lr>", "<sip:client-facing;lr>"}
	got := routeSet(rrs)
	if want := []string{"<sip:client-facing;lr>", "<sip:backend-facing;lr>"}; !slices.Equal(got, want) {
		t.Errorf("route set %v, want %v", got, want)
	}
	if rrs[0] != "<sip:backend-facing;lr>" {
		t.Errorf("Record-Routes changed: %v", rrs)
	}
}
