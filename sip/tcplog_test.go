package sip

import (
	"bytes"
	"log/slog"
	"net/netip"
	"strings"
	"testing"
)

// TCP connections closed at accept over a cap are logged with the flag to
// raise and the source, once per summary and only when some were closed
// since the last: a NAT past -sip-tcp-max-conns-per-source otherwise
// showed resets to its clients and nothing in the log.
func TestTCPRefusalsLogged(t *testing.T) {
	var buf bytes.Buffer
	s := &Server{log: slog.New(slog.NewTextHandler(&buf, nil))}
	s.cfg.TCPMaxConnsPerSource, s.cfg.TCPMaxConns = 4, 6
	var seen tcpRefusalsSeen
	s.logTCPRefusals(&seen)
	if buf.Len() != 0 {
		t.Fatalf("logged with nothing refused:\n%s", buf.String())
	}
	s.metrics.TCPRefusedSource.Add(6)
	s.tcp.lastRefusedSource = netip.MustParseAddr("198.51.100.9")
	s.metrics.TCPRefused.Add(2)
	s.metrics.UnknownDialogSourceLimited.Add(3)
	s.cfg.UnknownDialogSourceRate = 20
	s.logTCPRefusals(&seen)
	out := buf.String()
	for _, want := range []string{"-sip-tcp-max-conns-per-source", "closed=6", "source=198.51.100.9", "max_per_source=4", "-sip-tcp-max-conns are open", "closed=2", "max=6", "-sip-unknown-dialog-source-rate", "refused=3", "per_source_rate=20"} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q:\n%s", want, out)
		}
	}
	buf.Reset()
	s.logTCPRefusals(&seen)
	if buf.Len() != 0 {
		t.Fatalf("logged again with nothing new refused:\n%s", buf.String())
	}
}
