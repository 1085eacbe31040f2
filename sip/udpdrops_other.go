//go:build !linux

package sip

import "net"

// udpDrops is not known outside Linux.
func udpDrops(*net.UDPConn) (uint32, bool) { return 0, false }
