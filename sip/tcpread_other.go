//go:build !unix

package sip

import "net"

// readParked reads into a buffer from the pool. Without a way to wait for
// readability holding no buffer, a waiting connection holds one here.
func readParked(c *net.TCPConn) ([]byte, error) { return readParkedUpTo(c, tcpReadSize) }

// readParkedUpTo is readParked reading at most limit bytes (limit >= 1;
// at most tcpReadSize whatever limit).
func readParkedUpTo(c *net.TCPConn, limit int) ([]byte, error) {
	b := getReadBuf()
	n, err := c.Read(b[:min(limit, cap(b))])
	if n > 0 {
		return b[:n], err
	}
	releaseReadBuf(b)
	return nil, err
}
