//go:build !unix

package sip

// waitReadable returns at once: without a way to wait for readability
// here, the session's own read waits (on the deeper stack of a TLS read).
func waitReadable(*tcpConn) error { return nil }
