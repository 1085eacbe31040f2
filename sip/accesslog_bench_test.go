package sip

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/sluicelb/sluice/accesslog"
)

// benchLog is a JSON access log to a file of b's, or nil for "off".
func benchLog(b *testing.B, on bool) *accesslog.Logger {
	if !on {
		return nil
	}
	l, err := accesslog.New(accesslog.Options{Dest: filepath.Join(b.TempDir(), "sip.log"), Format: accesslog.JSON, Sample: accesslog.DefaultSample})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = l.Close() })
	return l
}

// BenchmarkNewWorkLog is one new-work transaction end to end, with the
// access log off and on, on the calling goroutine: an OPTIONS admitted
// and sent to the backend, the backend's 200 (handed in as the reader
// would) relayed, the transaction ended and, with the log, its record
// queued for the writer. With the log off the allocations are the
// proxy's alone: the log must add none; on, it adds its record's strings.
func BenchmarkNewWorkLog(b *testing.B) {
	for _, on := range []bool{false, true} {
		b.Run(map[bool]string{false: "off", true: "on"}[on], func(b *testing.B) {
			be := newUAS(b, "b1")
			be.drop.Store(true)
			be.mode.Store(modeSilent)
			s := startServer(b, serverOpts{backends: uasAddrs([]*uas{be}), alog: benchLog(b, on)})
			src := source{addr: netip.MustParseAddrPort("127.0.0.1:9")}
			head := fmt.Sprintf("OPTIONS sip:svc@%s SIP/2.0\r\nVia: SIP/2.0/UDP 127.0.0.1:9;branch=z9hG4bK-nw", s.udpAddr())
			tail := "\r\nMax-Forwards: 70\r\nFrom: <sip:a@test>;tag=a\r\nTo: <sip:svc@test>\r\nCall-ID: nw@test\r\nCSeq: 1 OPTIONS\r\nContent-Length: 0\r\n\r\n"
			msg := make([]byte, 0, 512)
			res := make([]byte, 0, 512)
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				i++
				msg = append(strconv.AppendInt(append(msg[:0], head...), int64(i), 10), tail...)
				s.handleDatagram(msg, src)
				var br string
				s.txns.mu.Lock()
				for _, t := range s.txns.byClient {
					br = t.branch
				}
				s.txns.mu.Unlock()
				res = append(res[:0], "SIP/2.0 200 OK\r\nVia: SIP/2.0/UDP "...)
				res = append(res, s.udpAddr().String()...)
				res = append(res, ";branch="...)
				res = append(res, br...)
				res = append(res, "\r\nVia: SIP/2.0/UDP 127.0.0.1:9;received=127.0.0.1;rport=9;branch=z9hG4bK-nw"...)
				res = strconv.AppendInt(res, int64(i), 10)
				res = append(res, "\r\nFrom: <sip:a@test>;tag=a\r\nTo: <sip:svc@test>;tag=b\r\nCall-ID: nw@test\r\nCSeq: 1 OPTIONS\r\nContent-Length: 0\r\n\r\n"...)
				s.handleDatagram(res, source{addr: be.addr})
			}
			if n := s.txns.Len(); n != 0 {
				b.Fatalf("%d transactions left: the answers did not end them", n)
			}
		})
	}
}
