package sip

import (
	"fmt"
	"net/netip"
	"testing"
	"time"
)

// BenchmarkInDialogBYE measures the stateless path: parse, verify the
// token, pop our Route, add our Via, serialize and send a BYE.
func BenchmarkInDialogBYE(b *testing.B) {
	be := newUAS(b, "b1")
	be.drop.Store(true)
	be.mode.Store(modeSilent)
	s := testServer(b, []*uas{be}, nil, nil)
	token := s.signer.PoolToken("default", tokenSubject("b1", "bench@test"), time.Now().Add(time.Hour))
	msg := []byte(fmt.Sprintf("BYE sip:bob@127.0.0.1 SIP/2.0\r\nVia: SIP/2.0/UDP 127.0.0.1:9;branch=z9hG4bK-bench\r\nMax-Forwards: 70\r\nRoute: <sip:%s;lr;sl=%s>\r\nFrom: <sip:a@test>;tag=a\r\nTo: <sip:b@test>;tag=b\r\nCall-ID: bench@test\r\nCSeq: 2 BYE\r\nContent-Length: 0\r\n\r\n", s.udpAddr(), token))
	src := source{addr: netip.MustParseAddrPort("127.0.0.1:9")}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			s.handleDatagram(msg, src)
		}
	})
	if s.metrics.Affinity.Load() == 0 {
		b.Fatal("nothing forwarded")
	}
}

// BenchmarkRelayResponse measures the response path: parse, pop our Via,
// look up the transaction table, serialize and send.
func BenchmarkRelayResponse(b *testing.B) {
	be := newUAS(b, "b1")
	be.drop.Store(true)
	s := testServer(b, []*uas{be}, nil, nil)
	// The branch we would have given a BYE from 127.0.0.1:9 sent to be.
	k := clientTxn{branch: "z9hG4bK-bench", host: "127.0.0.1", port: 9, src: netip.MustParseAddrPort("127.0.0.1:9")}
	br := s.branches.branch(&k, 1, target{addr: be.addr})
	msg := []byte(fmt.Sprintf("SIP/2.0 200 OK\r\nVia: SIP/2.0/UDP %s;branch=%s\r\nVia: SIP/2.0/UDP 127.0.0.1:9;branch=z9hG4bK-bench;received=127.0.0.1;rport=9\r\nFrom: <sip:a@test>;tag=a\r\nTo: <sip:b@test>;tag=b\r\nCall-ID: bench@test\r\nCSeq: 2 BYE\r\nContent-Length: 0\r\n\r\n", s.udpAddr(), br))
	src := source{addr: be.addr}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			s.handleDatagram(msg, src)
		}
	})
	if s.metrics.Relayed.Load() == 0 {
		b.Fatal("nothing relayed")
	}
}
