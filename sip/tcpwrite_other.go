//go:build !unix

package sip

import "net"

// tryWrite takes nothing on platforms without a non-blocking write: every
// message goes through the connection's flusher, which waits for the peer
// in a goroutine of its own.
func tryWrite(c *net.TCPConn, p []byte) (int, error) { return 0, nil }
