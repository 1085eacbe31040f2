package admin

import (
	"context"
	"net"
	"time"
)

func newLocalListener() (net.Listener, error) { return net.Listen("tcp", "127.0.0.1:0") }

func contextWithTimeout(d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), d)
}
