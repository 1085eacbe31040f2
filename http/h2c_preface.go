package http

import (
	"bytes"
	"io"
	"net"
	"strconv"
	"time"
)

// h2cPreface is the HTTP/2 client connection preface (RFC 9113 §3.4):
// the first bytes of every h2c connection with prior knowledge.
const h2cPreface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

// h2cWrongProtocol is the answer to an HTTP/1.x request on the h2c
// listener: an operator probing the port with curl or a health check
// reads why, where x/net's server would answer with HTTP/2 frames that
// an HTTP/1.1 client reports as garbage ("HTTP/0.9").
var h2cWrongProtocol = func() string {
	const body = "this port speaks HTTP/2 with prior knowledge only (h2c); HTTP/1.1 is served on -http-listen\n"
	return "HTTP/1.1 505 HTTP Version Not Supported\r\nContent-Type: text/plain; charset=utf-8\r\n" +
		"Connection: close\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
}()

// prefixConn is a connection whose first reads return pre, then the
// connection's own bytes.
type prefixConn struct {
	net.Conn
	pre []byte
}

func (c *prefixConn) Read(p []byte) (int, error) {
	if len(c.pre) > 0 {
		n := copy(p, c.pre)
		c.pre = c.pre[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

// checkH2CPreface reads the first bytes of an h2c connection, at most
// until timeout. A connection that opens with the HTTP/2 preface (or with
// bytes of it, then ends or stalls: x/net's server says what is wrong) is
// returned, those bytes to be read again, and true. One that opens with
// anything else, an HTTP/1.x request line most likely, is answered 505
// and false is returned: the caller closes it.
func checkH2CPreface(c net.Conn, timeout time.Duration) (net.Conn, bool) {
	buf := make([]byte, len(h2cPreface))
	c.SetReadDeadline(time.Now().Add(timeout))
	n, _ := io.ReadFull(c, buf) // short or stalled: the HTTP/2 server says what is wrong
	c.SetReadDeadline(time.Time{})
	got := buf[:n]
	if !bytes.HasPrefix([]byte(h2cPreface), got) {
		c.SetWriteDeadline(time.Now().Add(time.Second))
		io.WriteString(c, h2cWrongProtocol)
		return c, false
	}
	return &prefixConn{Conn: c, pre: got}, true
}
