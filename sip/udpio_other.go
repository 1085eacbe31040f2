//go:build !linux

package sip

import (
	"net"
	"net/netip"
)

// Elsewhere than Linux the UDP socket is read and written with net's calls
// (udpio_linux.go has the raw ones).

type udpRaw struct{}

func newUDPRaw(*net.UDPConn) *udpRaw { return nil }

func (*udpRaw) send([]byte, netip.AddrPort) (bool, error) { return false, nil }

type udpReader struct{}

func newUDPReader(*net.UDPConn, int) *udpReader { return nil }

func (*udpReader) read() (int, error) { return 0, net.ErrClosed }

func (*udpReader) datagram(int) ([]byte, netip.AddrPort) { return nil, netip.AddrPort{} }

func newRawBatch(*udpRaw) batchWriter { return nil }
