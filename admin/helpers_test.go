package admin

import (
	"context"
	"net"
	"net/http"
	"time"
)

func newLocalListener() (net.Listener, error) { return net.Listen("tcp", "127.0.0.1:0") }

func contextWithTimeout(d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), d)
}

// onLoopback makes req look as if it came to a listener on 127.0.0.1:9090
// for that address, as a client given the listen address sends it.
func onLoopback(req *http.Request) *http.Request {
	req.Host = "127.0.0.1:9090"
	return req.WithContext(context.WithValue(req.Context(), http.LocalAddrContextKey, &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 9090}))
}
