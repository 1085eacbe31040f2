package cluster

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/logging"

	"github.com/sluicelb/sluice/admission"
)

// FailPolicy is what a node does while Redis is unreachable.
type FailPolicy uint8

// Fail policies.
const (
	FailLocal  FailPolicy = iota // each node enforces limit ÷ last known node count
	FailOpen                     // each node enforces the full limit on its own
	FailClosed                   // rules refuse (or delay) everything they match
)

var failNames = [...]string{"local", "open", "closed"}

func (p FailPolicy) String() string {
	if int(p) < len(failNames) {
		return failNames[p]
	}
	return fmt.Sprintf("fail(%d)", p)
}

// ParseFailPolicy parses "local", "open" or "closed".
func ParseFailPolicy(s string) (FailPolicy, error) {
	for i, n := range failNames {
		if strings.EqualFold(s, n) {
			return FailPolicy(i), nil
		}
	}
	return 0, fmt.Errorf("unknown cluster fail policy %q (want local, open or closed)", s)
}

// Config configures a node's membership in a cluster. Fields map 1:1 to the
// -cluster-* flags.
type Config struct {
	// Redis is the server's URL: redis://[user:pass@]host:port/db or
	// rediss:// (TLS); with ?master_name=NAME (and more addr=host:port) the
	// addresses are Sentinels, user:pass@ is the Sentinels' user and
	// ?username=U&password=P the master's; the schemes redis+cluster:// and
	// rediss+cluster:// address a Redis Cluster. Empty: no cluster. Every
	// client of that Redis can change the cluster's budgets: give the
	// cluster a user of its own (ACL) and TLS (see the README, "Trust").
	Redis string
	// Name names the cluster: nodes with the same Redis and Name share
	// budgets. Default "sluice".
	Name string
	// Node identifies this node among the members. Default host name and
	// process id.
	Node string
	// Fail is the policy while Redis is unreachable. Default FailLocal.
	Fail FailPolicy
	// Wait bounds how long a decision that finds no leased token waits for
	// a lease round trip. Default 2ms; at most 10ms.
	Wait time.Duration
	// Timeout bounds each Redis round trip of the background leasers and
	// the heartbeat; two failures or timeouts in a row mark Redis
	// unreachable. Decisions never wait this long (see Wait). Default 200ms.
	Timeout time.Duration
	// Heartbeat is the membership heartbeat period; a node is counted for
	// three periods after its last heartbeat. Default 50ms.
	Heartbeat time.Duration
	// DialogMax bounds the SIP dialogs other nodes' changes may add to this
	// node's dialog table: an insert from another node is not applied
	// while the table holds DialogMax entries or more (counted in
	// DialogStats.Capped), so other nodes (or whoever holds the affinity
	// key) never fill more than DialogMax entries (64 bytes each) and
	// the rest of -sip-dialog-max stays for this node's own dialogs.
	// Default 1,000,000 (64 MB).
	DialogMax int
}

// DefaultConfig returns the defaults, written once here.
func DefaultConfig() Config {
	return Config{Name: "sluice", Fail: FailLocal, Wait: 2 * time.Millisecond, Timeout: 200 * time.Millisecond, Heartbeat: 50 * time.Millisecond,
		DialogMax: 1_000_000}
}

// Enabled reports whether the node joins a cluster.
func (c Config) Enabled() bool { return c.Redis != "" }

// ErrConfig is wrapped by every configuration error.
var ErrConfig = errors.New("cluster: bad configuration")

// FieldError is a configuration error about one Config field; it is
// admission.FieldError, the one type of every package, with Pkg
// "cluster", and its cause wraps ErrConfig.
type FieldError = admission.FieldError

func fieldErr(field, format string, a ...any) error {
	return admission.NewFieldError("cluster", field, "%w: "+format, append([]any{ErrConfig}, a...)...)
}

// Validate reports the first invalid field, also when Redis is empty (a
// bad value is refused even while the node is standalone).
func (c Config) Validate() error {
	if err := c.fill(); err != nil {
		return err
	}
	if c.Redis != "" {
		rdb, err := NewClient(c.Redis, c.Timeout)
		if err != nil {
			return err
		}
		rdb.Close()
	}
	return nil
}

// fill sets defaults for zero fields and validates.
func (c *Config) fill() error {
	d := DefaultConfig()
	if c.Name == "" {
		c.Name = d.Name
	}
	if c.Node == "" {
		h, _ := os.Hostname()
		c.Node = fmt.Sprintf("%s-%d", h, os.Getpid())
	}
	if c.Wait == 0 {
		c.Wait = d.Wait
	}
	if c.Timeout == 0 {
		c.Timeout = d.Timeout
	}
	if c.Heartbeat == 0 {
		c.Heartbeat = d.Heartbeat
	}
	if c.DialogMax == 0 {
		c.DialogMax = d.DialogMax
	}
	switch {
	case strings.ContainsAny(c.Name, "{} \t\r\n"):
		return fieldErr("Name", "%q must not contain braces (they delimit Redis hash tags) or white space", c.Name)
	case strings.ContainsAny(c.Node, "{} \t\r\n"):
		return fieldErr("Node", "%q must not contain braces or white space", c.Node)
	case c.Wait < 0 || c.Wait > 10*time.Millisecond:
		return fieldErr("Wait", "%s must be in [0, 10ms]: decisions wait at most this long for a lease", c.Wait)
	case c.Timeout < 0:
		return fieldErr("Timeout", "%s must be positive", c.Timeout)
	case c.Heartbeat < 0:
		return fieldErr("Heartbeat", "%s must be positive", c.Heartbeat)
	case c.Heartbeat > 10*time.Second:
		return fieldErr("Heartbeat", "%s must be at most 10s: a dead node counts as a member for three heartbeats", c.Heartbeat)
	case c.DialogMax < 0:
		return fieldErr("DialogMax", "%d must be positive", c.DialogMax)
	case c.Fail > FailClosed:
		return fieldErr("Fail", "unknown fail policy %d", c.Fail)
	}
	return nil
}

// NewClient opens a go-redis universal client for url (see Config.Redis).
// Retries are off and timeouts short: a leaser that fails falls back to the
// fail policy rather than retrying while decisions run dry. go-redis's own
// log lines (one per failed dial, many a second while Redis is away) are
// silenced: the cluster reports the outage once, as an event, a metric and
// in /status. Every connection's replies are bounded (respguard.go).
func NewClient(rawURL string, timeout time.Duration) (redis.UniversalClient, error) {
	redis.SetLogger(&logging.VoidLogger{})
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fieldErr("Redis", "not a URL (want redis://host:port/db)") // url's error would repeat a password
	}
	dial := 2 * timeout
	switch {
	case u.Scheme == "redis+cluster" || u.Scheme == "rediss+cluster":
		u.Scheme = strings.TrimSuffix(u.Scheme, "+cluster")
		o, err := redis.ParseClusterURL(u.String())
		if err != nil {
			return nil, fieldErr("Redis", "Redis Cluster URL %s: %w", redact(u), err)
		}
		o.MaxRetries, o.DialerRetries, o.DialTimeout, o.ReadTimeout, o.WriteTimeout = -1, 1, dial, timeout, timeout
		o.Dialer = guardDialer(redis.NewDialer(&redis.Options{DialTimeout: dial, TLSConfig: o.TLSConfig}))
		return redis.NewClusterClient(o), nil
	case u.Query().Has("master_name"):
		o, err := redis.ParseFailoverURL(u.String())
		if err != nil {
			return nil, fieldErr("Redis", "Redis Sentinel URL %s: %w", redact(u), err)
		}
		o.MaxRetries, o.DialerRetries, o.DialTimeout, o.ReadTimeout, o.WriteTimeout = -1, 1, dial, timeout, timeout
		o.Dialer = guardDialer(redis.NewDialer(&redis.Options{DialTimeout: dial, TLSConfig: o.TLSConfig}))
		return redis.NewFailoverClient(o), nil
	case u.Scheme == "redis" || u.Scheme == "rediss":
		o, err := redis.ParseURL(u.String())
		if err != nil {
			return nil, fieldErr("Redis", "URL %s: %w", redact(u), err)
		}
		o.MaxRetries, o.DialerRetries, o.DialTimeout, o.ReadTimeout, o.WriteTimeout = -1, 1, dial, timeout, timeout
		o.Dialer = guardDialer(redis.NewDialer(o))
		return redis.NewClient(o), nil
	}
	return nil, fieldErr("Redis", "URL %s: scheme must be redis, rediss, redis+cluster or rediss+cluster", redact(u))
}

// redact hides the passwords in u for error messages: the user's and
// those a query may carry (a Sentinel URL's master credentials are
// ?username=U&password=P).
func redact(u *url.URL) string {
	r := *u
	if q := r.Query(); q.Has("password") || q.Has("sentinel_password") {
		for _, k := range []string{"password", "sentinel_password"} {
			if q.Has(k) {
				q.Set(k, "xxxxx")
			}
		}
		r.RawQuery = q.Encode()
	}
	return r.Redacted()
}

// CheckReachable asks Redis once whether the configuration itself is
// wrong: a refused password, a database index out of range or any other
// answer Redis gives to a bad configuration is returned as an error (the
// node must not run on for ever under its fail policy because of a typo).
// A Redis that does not answer at all (refused, timed out) is not an
// error: the node starts under its fail policy and joins when it can.
func CheckReachable(ctx context.Context, rdb redis.UniversalClient) error {
	err := rdb.Ping(ctx).Err()
	if err == nil {
		return nil
	}
	var rerr redis.Error
	if errors.As(err, &rerr) {
		return fieldErr("Redis", "Redis refused the configuration: %s", rerr.Error())
	}
	return nil
}
