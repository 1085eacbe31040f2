package tlsedge

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicelb/sluice/admission"
)

// Event kinds of the certificate store.
const (
	// EventCertLoaded: a certificate file was loaded anew (a reload or a
	// change of the file) and serves new handshakes.
	EventCertLoaded admission.EventKind = "tls.cert_loaded"
	// EventCertRefused: a new certificate file was refused (unreadable,
	// wrong key, expired, ...); the certificate in service stays.
	EventCertRefused admission.EventKind = "tls.cert_refused"
	// EventCertExpiring: a certificate in service expires within
	// ExpiryWarning (or has expired); once per certificate.
	EventCertExpiring admission.EventKind = "tls.cert_expiring"
)

// DefaultExpiryWarning is how long before a certificate expires the
// EventCertExpiring event fires.
const DefaultExpiryWarning = 14 * 24 * time.Hour

// DefaultPollInterval is how often a node looks for changed certificate
// files (Watch).
const DefaultPollInterval = 5 * time.Second

// Deps are what a Store takes from its node.
type Deps struct {
	// Tickets supplies the secrets session ticket keys are derived from;
	// nil: a random secret of this process (a restart ends resumption).
	Tickets TicketKeySource
	// Events receives the store's events; nil drops them.
	Events admission.EventSink
	// Now is the wall clock (validity, expiry, ticket key hours); nil is
	// time.Now.
	Now func() time.Time
	// ExpiryWarning is how long before expiry EventCertExpiring fires; 0
	// is DefaultExpiryWarning.
	ExpiryWarning time.Duration
	// Reloaded, when set, is told of every load of a certificate file
	// after start (Reload, Poll): its spec and nil when it took.
	Reloaded func(spec string, err error)
}

// Store holds the certificates of every TLS listener of a node. Handshakes
// read an immutable snapshot through an atomic pointer (GetCertificate
// takes no lock); Reload and Poll build a new snapshot, which only new
// handshakes see: connections already established are never touched.
// Safe for concurrent use.
type Store struct {
	deps    Deps
	snap    atomic.Pointer[snapshot]
	tickets *ticketKeySet

	mu     sync.Mutex // serialises loads and expiry checks; guards slots, warned
	slots  []*slot
	warned map[[32]byte]bool // certificates EventCertExpiring fired for

	reloadOK, reloadFailed, reloadSame atomic.Uint64
}

// slot is one -tls-cert: what serves and how its files looked when last
// read.
type slot struct {
	spec    CertSpec
	cur     *entry
	stamps  [2]fileStamp // certificate, key file
	lastErr error        // of the last load attempt; nil when it took
}

// snapshot is what handshakes read: built whole, never changed.
type snapshot struct {
	all   []*entry            // in -tls-cert order: all[0] is the default
	exact map[string][]*entry // by name, in -tls-cert order
	wild  map[string][]*entry // "*.example.com" by "example.com"
}

// New loads every certificate of cfg.Certs; any bad one is an error
// naming its file (nothing starts with a certificate that cannot serve).
// At least one is needed.
func New(cfg Config, deps Deps) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if len(cfg.Certs) == 0 {
		return nil, fieldError("Certs", "no certificate: %w", ErrSpec)
	}
	if deps.Now == nil {
		deps.Now = time.Now
	}
	if deps.ExpiryWarning <= 0 {
		deps.ExpiryWarning = DefaultExpiryWarning
	}
	s := &Store{deps: deps, warned: map[[32]byte]bool{}}
	s.tickets = newTicketKeySet(deps.Tickets, deps.Now)
	now := deps.Now()
	for _, c := range cfg.Certs {
		spec, _ := ParseCertSpec(c) // Validate parsed it
		sl := &slot{spec: spec, stamps: stampFiles(spec)}
		e, err := loadCert(spec, now)
		if err != nil {
			return nil, fieldError("Certs", "%w", err)
		}
		sl.cur = e
		s.slots = append(s.slots, sl)
	}
	s.publish()
	s.mu.Lock()
	s.checkExpiryLocked(now)
	s.mu.Unlock()
	return s, nil
}

// publish builds the snapshot of the slots in service. Called with mu
// held, or before the Store is shared.
func (s *Store) publish() {
	sn := &snapshot{exact: map[string][]*entry{}, wild: map[string][]*entry{}}
	for _, sl := range s.slots {
		e := sl.cur
		sn.all = append(sn.all, e)
		for _, n := range e.names {
			if rest, ok := strings.CutPrefix(n, "*."); ok && rest != "" {
				sn.wild[rest] = append(sn.wild[rest], e)
			} else {
				sn.exact[n] = append(sn.exact[n], e)
			}
		}
	}
	s.snap.Store(sn)
}

// GetCertificate picks the certificate of a handshake by its SNI name:
// a certificate naming it exactly, else one whose wildcard covers its
// first label (*.example.com covers a.example.com, neither example.com
// nor a.b.example.com), else the first -tls-cert. Case and a trailing dot
// are ignored. Without SNI, a certificate naming the local IP address the
// client reached, else the first. Among several certificates for one name
// (ECDSA and RSA) the first the client supports wins. It takes no lock:
// it reads the snapshot in force.
func (s *Store) GetCertificate(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	sn := s.snap.Load()
	name := normName(hello.ServerName)
	if name == "" && hello.Conn != nil {
		name = ipName(hello.Conn.LocalAddr())
	}
	if name != "" {
		if es := sn.exact[name]; es != nil {
			return pick(hello, es), nil
		}
		if i := strings.IndexByte(name, '.'); i > 0 && name[:i] != "*" {
			if es := sn.wild[name[i+1:]]; es != nil {
				return pick(hello, es), nil
			}
		}
	}
	return sn.all[0].cert, nil
}

// pick returns the first of es the client supports, else the first.
func pick(hello *tls.ClientHelloInfo, es []*entry) *tls.Certificate {
	if len(es) > 1 {
		for _, e := range es {
			if hello.SupportsCertificate(e.cert) == nil {
				return e.cert
			}
		}
	}
	return es[0].cert
}

// Reload re-reads every certificate file. A good file replaces the
// certificate it held; a bad one (unreadable, no or wrong key, expired,
// not yet valid, no names) is refused with EventCertRefused and the
// certificate in service stays. The error joins the refusals, each
// naming its file; nil when every file took. Only handshakes after it
// see the new certificates.
func (s *Store) Reload() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.loadLocked(func(*slot, [2]fileStamp) bool { return true })
}

// Poll reloads the certificates whose files changed (modification time,
// size or inode, the key file's too) since they were last read, as Reload
// does, and fires the expiry events due. A node calls it every few
// seconds (Watch). A file caught half-written is refused and read again
// at its next change.
func (s *Store) Poll() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.loadLocked(func(sl *slot, now [2]fileStamp) bool { return now != sl.stamps })
}

// Watch calls Poll at every tick until ctx is done. Its errors are events
// already.
func (s *Store) Watch(ctx context.Context, ticks <-chan time.Time) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticks:
			s.Poll()
		}
	}
}

// loadLocked loads the slots want says to, publishes a new snapshot when
// one changed and checks expiry.
func (s *Store) loadLocked(want func(*slot, [2]fileStamp) bool) error {
	now := s.deps.Now()
	var errs []error
	changed := false
	for _, sl := range s.slots {
		st := stampFiles(sl.spec) // before the read: a change during it is seen next time
		if !want(sl, st) {
			continue
		}
		sl.stamps = st
		e, err := loadCert(sl.spec, now)
		sl.lastErr = err
		if s.deps.Reloaded != nil {
			s.deps.Reloaded(sl.spec.String(), err)
		}
		if err != nil {
			s.reloadFailed.Add(1)
			errs = append(errs, err)
			s.emit(now, EventCertRefused, sl.spec.Cert, fmt.Sprintf("%v; the certificate in service (serial %s, expires %s) stays", err, serial(sl.cur), sl.cur.cert.Leaf.NotAfter.UTC().Format(time.RFC3339)))
			continue
		}
		if e.fingerprint == sl.cur.fingerprint {
			s.reloadSame.Add(1)
			continue // the same certificate: nothing to swap
		}
		s.reloadOK.Add(1)
		old := sl.cur
		sl.cur = e
		changed = true
		s.emit(now, EventCertLoaded, sl.spec.Cert, fmt.Sprintf("new certificate for %s (serial %s, expires %s) replaces serial %s for new handshakes", strings.Join(e.names, ", "), serial(e), e.cert.Leaf.NotAfter.UTC().Format(time.RFC3339), serial(old)))
	}
	if changed {
		s.publish()
	}
	s.checkExpiryLocked(now)
	return errors.Join(errs...)
}

// checkExpiryLocked fires EventCertExpiring once for each certificate in
// service within ExpiryWarning of its end, and forgets those no longer in
// service.
func (s *Store) checkExpiryLocked(now time.Time) {
	live := map[[32]byte]bool{}
	for _, sl := range s.slots {
		e := sl.cur
		live[e.fingerprint] = true
		left := e.cert.Leaf.NotAfter.Sub(now)
		if left > s.deps.ExpiryWarning || s.warned[e.fingerprint] {
			continue
		}
		s.warned[e.fingerprint] = true
		msg := fmt.Sprintf("certificate for %s (serial %s) expires %s, in %s: renew it", strings.Join(e.names, ", "), serial(e), e.cert.Leaf.NotAfter.UTC().Format(time.RFC3339), left.Round(time.Minute))
		if left <= 0 {
			msg = fmt.Sprintf("certificate for %s (serial %s) expired %s and still serves: renew it", strings.Join(e.names, ", "), serial(e), e.cert.Leaf.NotAfter.UTC().Format(time.RFC3339))
		}
		s.emit(now, EventCertExpiring, sl.spec.Cert, msg)
	}
	for fp := range s.warned {
		if !live[fp] {
			delete(s.warned, fp)
		}
	}
}

func (s *Store) emit(now time.Time, kind admission.EventKind, subject, msg string) {
	if s.deps.Events != nil {
		s.deps.Events(admission.Event{Time: now, Kind: kind, Subject: subject, Message: msg})
	}
}

func serial(e *entry) string { return strings.ToUpper(e.cert.Leaf.SerialNumber.Text(16)) }

// CertInfo is one certificate in service, for /status.
type CertInfo struct {
	File    string   `json:"file"`
	KeyFile string   `json:"key_file,omitempty"`
	Names   []string `json:"names"`
	Issuer  string   `json:"issuer"`
	// Serial is the serial number in upper-case hexadecimal (as openssl
	// x509 -serial prints it).
	Serial          string    `json:"serial"`
	KeyType         string    `json:"key_type"`
	NotBefore       time.Time `json:"not_before"`
	NotAfter        time.Time `json:"not_after"`
	SecondsToExpiry int64     `json:"seconds_to_expiry"` // negative once expired
	LoadedAt        time.Time `json:"loaded_at"`
	// ReloadError is why the file's last load was refused; the
	// certificate above still serves.
	ReloadError string `json:"reload_error,omitempty"`
}

// Certs lists the certificates in service, in -tls-cert order.
func (s *Store) Certs() []CertInfo {
	now := s.deps.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]CertInfo, 0, len(s.slots))
	for _, sl := range s.slots {
		e := sl.cur
		leaf := e.cert.Leaf
		ci := CertInfo{
			File: sl.spec.Cert, KeyFile: sl.spec.Key, Names: append([]string(nil), e.names...),
			Issuer: leaf.Issuer.String(), Serial: serial(e), KeyType: e.keyType,
			NotBefore: leaf.NotBefore.UTC(), NotAfter: leaf.NotAfter.UTC(),
			SecondsToExpiry: int64(leaf.NotAfter.Sub(now) / time.Second), LoadedAt: e.loadedAt.UTC(),
		}
		if sl.lastErr != nil {
			ci.ReloadError = sl.lastErr.Error()
		}
		out = append(out, ci)
	}
	return out
}

// Stats counts the loads of certificate files after start: ReloadOK a
// new certificate put in service, ReloadUnchanged a file read again that
// held the certificate in service already (a SIGHUP re-reads every
// file), ReloadFailed a file refused.
type Stats struct {
	ReloadOK, ReloadFailed, ReloadUnchanged uint64
}

// Stats returns the counts so far.
func (s *Store) Stats() Stats {
	return Stats{ReloadOK: s.reloadOK.Load(), ReloadFailed: s.reloadFailed.Load(), ReloadUnchanged: s.reloadSame.Load()}
}

// fileStamp is how a file looked: enough to tell that it changed, even
// when replaced by a rename within the same second with the same size.
type fileStamp struct {
	mod   int64 // Unix nanoseconds
	size  int64
	ino   uint64
	dev   uint64
	valid bool
}

// stampFiles stamps spec's certificate and key files (following links,
// as a certbot live/ directory or a Kubernetes secret needs).
func stampFiles(spec CertSpec) [2]fileStamp {
	var st [2]fileStamp
	for i, f := range []string{spec.Cert, spec.Key} {
		if f == "" {
			continue
		}
		fi, err := os.Stat(f)
		if err != nil {
			continue
		}
		st[i] = fileStamp{mod: fi.ModTime().UnixNano(), size: fi.Size(), valid: true}
		st[i].dev, st[i].ino = fileID(fi)
	}
	return st
}
