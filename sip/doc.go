// Package sip is the SIP front end of sluice: an RFC 3261 proxy over UDP
// and TCP that forwards new work transaction-statefully with failover,
// keeps dialogs on their backend with a signed token in its Record-Route,
// relays in-dialog requests and responses without state, and turns
// admission refusals into 503 with Retry-After. It is built on sipgo's
// parser and message model; see README.md.
package sip

import (
	"log/slog"

	gosip "github.com/emiago/sipgo/sip"
)

// sipgo's components log through a package-global default logger, and its
// transport layer logs every unparsable datagram whole at ERROR. Nothing in
// this process should do that, so the default is made quiet once, at init,
// before any goroutine could read it (sipgo's global is not synchronized).
// Components that want logs pass their own logger explicitly.
func init() {
	gosip.SetDefaultLogger(slog.New(slog.DiscardHandler))
}
