package cluster

import (
	"context"
	"strings"
	"sync/atomic"
)

// dialogQueue bounds the dialog changes waiting to be published; past it
// they are dropped (counted): a dropped change only costs a token-less
// in-dialog request on another node the Call-ID hash's choice.
const dialogQueue = 4096

// DialogStats counts the dialog table changes shared with other nodes.
type DialogStats struct {
	Published uint64 `json:"published"`
	Applied   uint64 `json:"applied"`
	Dropped   uint64 `json:"dropped"` // queue full or Redis away
}

type dialogBus struct {
	published, applied, dropped atomic.Uint64
}

// ShareDialogs replicates the SIP dialog table between nodes by Redis
// publish/subscribe on the channel {sluice:NAME}:dialogs. publish (to be
// called on the message path) queues an encoded change without blocking;
// apply is called with every other node's changes. Lookups never touch
// Redis; changes made while Redis is away are not replayed. Both
// goroutines end with ctx.
func (c *Cluster) ShareDialogs(ctx context.Context, apply func([]byte)) (publish func([]byte)) {
	q := make(chan []byte, dialogQueue)
	channel := c.prefix + ":dialogs"
	self := c.cfg.Node + "\n"
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case msg := <-q:
				if !c.Up() {
					c.dialogs.dropped.Add(1)
					continue
				}
				pctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
				// Send what has queued up meanwhile in one pipeline.
				pipe := c.rdb.Pipeline()
				n := 1
				pipe.Publish(pctx, channel, self+string(msg))
			more:
				for n < 256 {
					select {
					case m := <-q:
						pipe.Publish(pctx, channel, self+string(m))
						n++
					default:
						break more
					}
				}
				_, err := pipe.Exec(pctx)
				cancel()
				c.roundTrips.Add(1)
				if err != nil {
					c.dialogs.dropped.Add(uint64(n))
					continue
				}
				c.dialogs.published.Add(uint64(n))
			}
		}
	}()
	sub := c.rdb.Subscribe(ctx, channel) // go-redis resubscribes after a reconnect
	go func() {
		<-ctx.Done()
		sub.Close() // ends the channel below
	}()
	go func() {
		for m := range sub.Channel() {
			node, payload, ok := strings.Cut(m.Payload, "\n")
			if !ok || node == c.cfg.Node {
				continue
			}
			c.dialogs.applied.Add(1)
			apply([]byte(payload))
		}
	}()
	return func(msg []byte) {
		select {
		case q <- msg:
		default:
			c.dialogs.dropped.Add(1)
		}
	}
}

// Dialogs returns the dialog sharing counters.
func (c *Cluster) Dialogs() DialogStats {
	return DialogStats{Published: c.dialogs.published.Load(), Applied: c.dialogs.applied.Load(), Dropped: c.dialogs.dropped.Load()}
}
