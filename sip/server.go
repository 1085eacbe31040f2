package sip

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	gosip "github.com/emiago/sipgo/sip"

	"github.com/sluicelb/sluice/accesslog"
	"github.com/sluicelb/sluice/admission"
)

// Signer makes and checks the affinity tokens carried in our Record-Route:
// each names the dialog's pool and its subject (the backend id bound to
// the Call-ID). *lb.Signer implements it.
type Signer interface {
	PoolToken(pool, backendID string, expires time.Time) string
	VerifyPool(token string, now time.Time) (pool, backendID string, expires time.Time, ok bool)
}

// Deps are the collaborators of a Server.
type Deps struct {
	// Admission decides new work. Required.
	Admission *admission.Controller
	// Signer signs and verifies the backend token. Required.
	Signer Signer
	// Clock gives the monotonic time of admission decisions. Default
	// admission.MonoClock.
	Clock admission.Clock
	// MOP returns the memory overload limiter of a backend, or nil for none.
	// New calls it once per backend of Config.Backends, with defaults
	// filled in; SetBackends takes a hook of its own. A generation handed
	// in (Generation, SetGeneration) has its limiters already.
	MOP func(BackendConfig) *admission.MOP
	// ObserveForward, when set, is called with the time from a new-work
	// request's arrival to the relay of its backend's final answer, for a
	// latency histogram. It is called on the message path: it must be
	// quick and safe for concurrent use.
	ObserveForward func(time.Duration)
	// Events receives backend.state events from the OPTIONS health checks
	// (down, up, draining). May be nil.
	Events admission.EventSink
	// AccessLog, when set, gets one record per transaction the server
	// forwarded or answered (accesslog.Logger.LogSIP, which never
	// blocks). May be nil: then no record is built.
	AccessLog *accesslog.Logger
	// DialogShare, when set, receives every change of the dialog table so
	// the other nodes of a cluster can apply it (ApplyDialog). It is called
	// on the message path: it must not block. May be nil.
	DialogShare func(DialogEvent)
}

// Server is the SIP front end: a proxy on one UDP socket and one TCP
// listener. Create it with New, start it with Start, stop it with Close.
type Server struct {
	// noFastPath sends every message through sipgo's parse: not
	// Config.UDPFastPath (tests set it to compare the two paths).
	noFastPath bool
	viaPfx     atomic.Pointer[viaPrefix] // our Via up to its branch (fastreq.go)
	// ownDrops is what the UDP socket's receive queue dropped (owndrops.go).
	ownDrops ownDrops
	cfg      Config
	log      *slog.Logger // component=sip
	base     *slog.Logger // as given, for lb components that name themselves
	adm      *admission.Controller
	observe  func(time.Duration)               // Deps.ObserveForward, or nil
	share    atomic.Pointer[func(DialogEvent)] // Deps.DialogShare or SetDialogShare; nil: none
	dstore   atomic.Pointer[dialogStore]       // SetDialogStore; nil: none
	events   admission.EventSink               // Deps.Events, or nil
	alog     *accesslog.Logger                 // Deps.AccessLog, or nil
	signer   Signer
	clock    admission.Clock
	// pool is the backend generation served and SIP's side table of it.
	// It is replaced whole by SetGeneration and SetBackends; a message
	// loads it once and works with that set throughout. nil until a
	// generation is set.
	pool   atomic.Pointer[backendSet]
	parser *gosip.Parser
	// branches computes and checks the branch of our Via (branch.go).
	branches *brancher
	// flowSign makes and checks flow tokens (flowtoken.go); flows are
	// the client connections they name (flows.go).
	flowSign *flowSigner
	flows    flowTable

	adv   hostPort // advertised address
	advIP netip.Addr
	// edgeAdv are the advertised addresses by listener kind: [kindTCP]
	// is adv (UDP and TCP), the others those of the TLS, WS and WSS
	// listeners that are open (setEdgeAdvertise).
	edgeAdv [4]edgeAdv
	udp     *net.UDPConn
	udpRaw  *udpRaw // raw sendto on udp (udpio_linux.go, -sip-udp-raw-send); nil: net's call
	udpOut  *udpOut // the send queue of a read batch (udpbatch.go, -sip-udp-send-batch); nil: every send at once
	tcpLn   *net.TCPListener
	tlsLn   *net.TCPListener // -sip-tls-listen, nil when not configured
	wsLn    *net.TCPListener // -sip-ws-listen
	wssLn   *net.TCPListener // -sip-wss-listen
	tcp     tcpTable
	proxied proxyTable // per-client connections to PROXY-protocol backends
	txns    txnTable
	dialogs dialogTable
	pings   pingTable
	watched inDialogWatch
	// dialogLogs are the dialogs awaiting their access-log summary
	// (Config.AccessLogDialogs).
	dialogLogs dialogLogs
	metrics    Metrics
	// handshakeRefusals are the handshakes the gate refused, for the log
	// (stream.go).
	handshakeRefusals handshakeRefusals

	// proxyWaiting counts the connections from balancers whose PROXY
	// header is being read (proxyin.go), proxyPending holds them
	// (*net.TCPConn -> struct{}) for Stop to close.
	proxyWaiting atomic.Int64
	proxyPending sync.Map

	unknownShare sourceShare // per-source cap of requests of unknown dialogs
	localShare   sourceShare // per-UDP-source cap of our own answers (replyLocal)
	// localRate is the cap of localShare per second:
	// localReplySourceRate (0: no cap, for tests that need more).
	localRate atomic.Int64

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	closed atomic.Bool
	// listening is set once Start has opened the sockets: the OPTIONS
	// pings need them.
	listening atomic.Bool

	// reloadMu serialises SetGeneration and SetBackends with Start and
	// Close; it guards the fields below. The message path never takes it.
	reloadMu sync.Mutex
	started  bool // Start got past opening the sockets
	stopping bool // Close was called: start no goroutine
}

// Drain starts a graceful stop: from now on new work is refused with 503
// (Retry-After: -sip-busy-default) while in-dialog requests, CANCELs, ACKs
// and responses keep flowing, so established calls can end. Call Close
// when the drain period is over. Safe to call more than once. The flag is
// the admission controller's (SetDraining), the one every front end
// shares, so draining the controller drains this server too.
func (s *Server) Drain() {
	if !s.adm.Draining() {
		s.adm.SetDraining(true)
		s.log.Info("sip draining: new work refused, dialogs continue")
	}
}

// New validates cfg and builds a Server; it opens no socket.
func New(cfg Config, deps Deps, logger *slog.Logger) (*Server, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if deps.Admission == nil || deps.Signer == nil {
		return nil, errors.New("sip: admission controller and signer are required")
	}
	if deps.Clock == nil {
		deps.Clock = admission.MonoClock{}
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{
		cfg:        cfg,
		noFastPath: !cfg.UDPFastPath,
		log:        logger.With("component", "sip"),
		base:       logger,
		adm:        deps.Admission,
		observe:    deps.ObserveForward,
		events:     deps.Events,
		alog:       deps.AccessLog,
		signer:     deps.Signer,
		clock:      deps.Clock,
		parser:     newParser(),
	}
	s.branches = newBrancher(deps.Signer)
	s.flowSign = newFlowSigner(deps.Signer)
	s.flows.init()
	s.localRate.Store(localReplySourceRate)
	if len(cfg.Backends) > 0 {
		specs, cfgs, err := checkBackends(cfg.Backends)
		if err != nil {
			return nil, err
		}
		set, err := s.buildSet(specs, cfgs, nil, deps.MOP)
		if err != nil {
			return nil, err
		}
		s.pool.Store(set)
	}
	s.tcp.init()
	s.proxied.init()
	s.txns.init()
	s.dialogs.init(cfg.DialogTTL, cfg.DialogMax)
	if d, ok := deps.Signer.(KeyDeriver); ok {
		s.dialogs.hkey = newSipKey(d.DeriveKey(dialogKeyLabel))
	}
	s.pings.init()
	s.SetDialogShare(deps.DialogShare)
	return s, nil
}

// errQuotedVia refuses a Via holding a quoted string.
var errQuotedVia = errors.New("quoted string in Via")

// newParser builds a sipgo parser that gives types only to the headers the
// proxy reads; every other header is kept as received (name and value) and
// written back unchanged.
func newParser() *gosip.Parser {
	all := gosip.DefaultHeadersParser()
	m := map[string]gosip.HeaderParser{}
	for _, k := range []string{"via", "v", "to", "t", "call-id", "i", "cseq", "max-forwards", "content-length", "l", "route"} {
		m[k] = all[k]
	}
	// sipgo splits Via values at every comma, also one inside a quoted
	// parameter value, and the received we add would land inside the
	// quote. Quoted strings have no use in a Via: refused (400).
	via := all["via"]
	m["via"] = func(name []byte, text string) (gosip.Header, error) {
		if strings.IndexByte(text, '"') >= 0 {
			return nil, errQuotedVia
		}
		return via(name, text)
	}
	m["v"] = m["via"]
	p := gosip.NewParser(gosip.WithHeadersParsers(m))
	return p
}

// Start opens the UDP socket and TCP listener and serves until Close or
// ctx is done. A generation must be in force (Config.Backends, or
// SetGeneration after New).
//
// A generation the server built (Config.Backends, SetBackends) is
// started here: its backends are pinged with OPTIONS when HealthInterval
// is set. Memory probes of -sip-backend metrics=URL are not started
// here: the caller builds them around the MOP limiters it hands over in
// Deps.MOP. A generation handed in is the caller's to start, after Start.
func (s *Server) Start(ctx context.Context) error {
	if s.pool.Load() == nil {
		return fieldError("Backends", "%w", ErrNoBackends)
	}
	s.ctx, s.cancel = context.WithCancel(ctx)
	s.parser.MaxMessageLength = s.cfg.MaxMessage
	uaddr, err := net.ResolveUDPAddr("udp", s.cfg.Listen)
	if err != nil {
		return fieldError("Listen", "%s: %w", s.cfg.Listen, err)
	}
	// UDP and TCP share the port. With port 0 the kernel picks the UDP
	// port, which may be taken for TCP: try a few.
	for try := 0; ; try++ {
		s.udp, err = net.ListenUDP("udp", uaddr)
		if err != nil {
			// err already reads "listen udp ADDR: ..."; the field names the flag.
			return fieldError("Listen", "%w", err)
		}
		la := s.udp.LocalAddr().(*net.UDPAddr)
		s.tcpLn, err = net.ListenTCP("tcp", &net.TCPAddr{IP: la.IP, Port: la.Port, Zone: la.Zone})
		if err == nil {
			break
		}
		s.udp.Close()
		if uaddr.Port != 0 || try == 20 {
			return fieldError("Listen", "%w (SIP takes the UDP and TCP port of one address)", err)
		}
	}
	_ = s.udp.SetReadBuffer(s.cfg.UDPBuffer)
	_ = s.udp.SetWriteBuffer(s.cfg.UDPBuffer)
	if s.cfg.UDPRawSend {
		s.udpRaw = newUDPRaw(s.udp)
	}
	if s.cfg.UDPSendBatch && s.cfg.UDPBatch > 1 {
		s.udpOut = newUDPOut(s.udp, s.udpRaw)
	}
	la := s.udp.LocalAddr().(*net.UDPAddr)
	if err := s.setAdvertise(la); err != nil {
		s.udp.Close()
		s.tcpLn.Close()
		return err
	}
	if err := s.listenEdge(); err != nil {
		s.udp.Close()
		s.tcpLn.Close()
		return err
	}
	if err := s.setEdgeAdvertise(); err != nil {
		s.closeEdge()
		s.udp.Close()
		s.tcpLn.Close()
		return err
	}
	s.listening.Store(true)
	s.wg.Add(3)
	go s.serveUDP()
	go s.serveTCP()
	go s.tick()
	s.serveEdge()
	s.reloadMu.Lock()
	p := s.pool.Load()
	s.log.Info("sip listening", "udp", la.String(), "tcp", s.tcpLn.Addr().String(), "advertise", s.adv.String(), "backends", len(p.list), "pools", len(p.gen.Pools()), "policy", s.cfg.Policy, "gomaxprocs", runtime.GOMAXPROCS(0),
		"tls", addrString(s.TLSAddr()), "ws", addrString(s.WSAddr()), "wss", addrString(s.WSSAddr()),
		"tcp_max_conns", s.cfg.TCPMaxConns, "tcp_max_conns_per_source", s.cfg.TCPMaxConnsPerSource, "unknown_dialog", s.cfg.UnknownDialog)
	s.started = true
	s.runBackendsLocked(p)
	s.reloadMu.Unlock()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		<-s.ctx.Done()
		s.shutdown()
	}()
	return nil
}

func (s *Server) setAdvertise(la *net.UDPAddr) error {
	adv := s.cfg.Advertise
	if adv == "" {
		ip, _ := netip.AddrFromSlice(la.IP)
		ip = ip.Unmap()
		if !ip.IsValid() || ip.IsUnspecified() {
			// The address the kernel would use to reach the first backend.
			c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(s.pool.Load().list[0].addr))
			if err != nil {
				return fieldError("Advertise", "none given and no local address found: %w", err)
			}
			ip, _ = netip.AddrFromSlice(c.LocalAddr().(*net.UDPAddr).IP)
			ip = ip.Unmap()
			c.Close()
		}
		adv = netip.AddrPortFrom(ip, uint16(la.Port)).String()
	}
	hp, err := parseHostPort(adv)
	if err != nil {
		return fieldError("Advertise", "%w", err)
	}
	s.adv = hp
	if ip, err := netip.ParseAddr(hp.host); err == nil {
		s.advIP = ip.Unmap()
	}
	return nil
}

// Addr returns the UDP address the server listens on (the TCP listener has
// the same port), or nil before Start.
func (s *Server) Addr() net.Addr {
	if s.udp == nil {
		return nil
	}
	return s.udp.LocalAddr()
}

// Close stops the server and waits for its goroutines.
func (s *Server) Close() error {
	s.reloadMu.Lock()
	s.stopping = true
	s.reloadMu.Unlock()
	if s.cancel != nil {
		s.cancel()
	}
	s.shutdown()
	s.wg.Wait()
	s.flushDialogStore(s.clock.Now(), time.Now())
	if set := s.pool.Load(); set != nil && set.owned {
		set.gen.Stop()
	}
	return nil
}

func (s *Server) shutdown() {
	if !s.closed.CompareAndSwap(false, true) {
		return
	}
	if s.udp != nil {
		s.udp.Close()
	}
	if s.tcpLn != nil {
		s.tcpLn.Close()
	}
	s.closeEdge()
	s.tcp.closeAll()
	s.proxied.closeAll()
	s.proxyPending.Range(func(c, _ any) bool { c.(*net.TCPConn).Close(); return true })
}

// source is where a message came from.
type source struct {
	addr netip.AddrPort
	conn *tcpConn // nil for UDP
	size int      // bytes of the message received (0: not known)
}

func (src source) transport() string {
	if src.conn != nil {
		return src.conn.kind.String()
	}
	return "UDP"
}

// serveUDP reads the UDP socket until it is closed and handles every
// datagram on this goroutine, in the order received: in batches of what is
// waiting, up to -sip-udp-batch, where the system has recvmmsg
// (udpio_linux.go), one at a time elsewhere or with a batch of 1.
func (s *Server) serveUDP() {
	defer s.wg.Done()
	if r := s.batchReader(); r != nil {
		for {
			n, err := r.read()
			if err != nil {
				if s.closed.Load() || errors.Is(err, net.ErrClosed) {
					return
				}
				s.log.Warn("sip udp read", "err", err)
				continue
			}
			if n > 1 && s.udpOut != nil {
				// What the batch makes us send leaves together at its
				// end (udpbatch.go); a batch of one sends at once.
				s.udpOut.begin()
				for i := range n {
					s.udpDatagram(r.datagram(i))
				}
				s.udpOut.end(s)
				continue
			}
			for i := range n {
				s.udpDatagram(r.datagram(i))
			}
		}
	}
	buf := make([]byte, 65536)
	for {
		n, addr, err := s.udp.ReadFromUDPAddrPort(buf)
		if err != nil {
			if s.closed.Load() || errors.Is(err, net.ErrClosed) {
				return
			}
			s.log.Warn("sip udp read", "err", err)
			continue
		}
		s.udpDatagram(buf[:n], addr)
	}
}

// batchReader is the recvmmsg reader of the UDP socket with a batch above
// 1, else nil.
func (s *Server) batchReader() *udpReader {
	if s.cfg.UDPBatch <= 1 {
		return nil
	}
	return newUDPReader(s.udp, s.cfg.UDPBatch)
}

// udpDatagram handles one datagram read from the UDP socket.
func (s *Server) udpDatagram(data []byte, addr netip.AddrPort) {
	if !addr.IsValid() {
		return // no source to answer or match against
	}
	addr = netip.AddrPortFrom(addr.Addr().Unmap(), addr.Port())
	if len(data) > s.cfg.MaxMessage {
		s.metrics.Oversize.Add(1)
		s.tooLargeDatagram(data, source{addr: addr})
		return
	}
	s.handleDatagram(data, source{addr: addr})
}

// handleDatagram handles one complete message (a UDP datagram or a framed
// TCP message). data is reused after it returns.
func (s *Server) handleDatagram(data []byte, src source) {
	src.size = len(data)
	if len(bytes.Trim(data, "\r\n \t\x00")) == 0 {
		return // keep-alive
	}
	defer func() {
		// A bug in message handling must not take the listener down.
		if r := recover(); r != nil {
			s.metrics.Panics.Add(1)
			s.log.Error("sip message handler panicked", "err", fmt.Sprint(r), "src", src.addr.String())
		}
	}()
	if s.fastResponse(data, src) || s.fastInDialog(data, src) {
		return
	}
	msg, err := s.parser.ParseSIP(data)
	if err != nil || msg == nil {
		s.malformed(data, src, "parse")
		return
	}
	if i := ctlInHead(data); i >= 0 {
		// A NUL or other control character in a header, the Call-ID or
		// the Request-URI: refused, as HTTP refuses them, never passed on
		// to a backend that may read the field differently.
		s.metrics.Malformed.Add(1)
		if req, ok := msg.(*gosip.Request); ok && req.Method != gosip.ACK && req.Via() != nil && req.CallID() != nil && req.CSeq() != nil {
			s.metrics.BadRequests.Add(1)
			s.replyLocal(req, src, 400, "Bad Request", "Warning: 399 "+s.adv.String()+` "control character in message head"`)
		} else {
			s.metrics.MalformedDropped.Add(1)
		}
		return
	}
	if dup := duplicated(msg); dup != "" {
		// Two Content-Length headers (either spelling): sipgo keeps both
		// and we would pass both on with the body. A backend that frames
		// its TCP stream by the first would read the body, under a
		// Content-Length of 0, as requests of ours that no admission
		// decision ever saw. Refused, as HTTP refuses them. The same
		// for the other headers RFC 3261 allows once (§7.3.1) that
		// route, match or count a request: we read the first, a backend
		// may read the last (two Froms: a from-domain= route chose the
		// pool for one caller, the backend serves another).
		s.metrics.Malformed.Add(1)
		if req, ok := msg.(*gosip.Request); ok && req.Method != gosip.ACK && req.Via() != nil && req.CallID() != nil && req.CSeq() != nil {
			s.metrics.BadRequests.Add(1)
			s.replyLocal(req, src, 400, "Bad Request", "Warning: 399 "+s.adv.String()+` "two `+dup+`"`)
		} else {
			s.metrics.MalformedDropped.Add(1)
		}
		return
	}
	// The transport is read back when forwarding (Via, Record-Route); the
	// source is not: it is src, passed along, so no string is made of it.
	msg.SetTransport(src.transport())
	switch m := msg.(type) {
	case *gosip.Request:
		s.metrics.Requests.Add(1)
		s.handleRequest(m, data, src)
	case *gosip.Response:
		s.metrics.Responses.Add(1)
		s.handleResponse(m, src)
	}
}

// duplicated returns the name of the first header RFC 3261 allows once
// (§7.3.1) that m holds twice in any spelling (compact or full, any
// case), "" when none: Content-Length in any message; From, To, Call-ID,
// CSeq and Max-Forwards in a request. It allocates nothing.
func duplicated(m gosip.Message) string {
	hs, ok := m.(interface{ Headers() []gosip.Header })
	if !ok {
		return ""
	}
	_, req := m.(*gosip.Request)
	const (
		cl = 1 << iota
		from
		to
		callID
		cseq
		maxFwd
	)
	var seen uint
	for _, h := range hs.Headers() {
		var bit uint
		var name string
		switch h.(type) {
		case *gosip.ContentLengthHeader:
			bit, name = cl, "Content-Length"
		case *gosip.ToHeader:
			bit, name = to, "To"
		case *gosip.CallIDHeader:
			bit, name = callID, "Call-ID"
		case *gosip.CSeqHeader:
			bit, name = cseq, "CSeq"
		case *gosip.MaxForwardsHeader:
			bit, name = maxFwd, "Max-Forwards"
		default:
			if headerNamed(h.Name(), "from") {
				bit, name = from, "From"
			}
		}
		if bit == 0 || !req && bit != cl {
			continue
		}
		if seen&bit != 0 {
			return name
		}
		seen |= bit
	}
	return ""
}

// ctlInHead returns the offset of the first control character (other than
// HTAB, and CR and LF, which end lines) in the head of the message in
// data, or -1.
func ctlInHead(data []byte) int {
	end := bytes.Index(data, []byte("\r\n\r\n"))
	if end < 0 {
		end = len(data)
	}
	for i, c := range data[:end] {
		if c < 0x20 && c != '\t' && c != '\r' && c != '\n' || c == 0x7f {
			return i
		}
	}
	return -1
}

// tooLargeDatagram answers 513 (RFC 3261 §21.4.11) to a datagram over
// -sip-max-message when it is a request whose Via, Call-ID and CSeq can be
// found; anything else is dropped.
func (s *Server) tooLargeDatagram(data []byte, src source) {
	p, ok := rawReply(data, 513, "Message Too Large")
	if !ok {
		return
	}
	src.size = len(data)
	if !s.localAllowed(src) || !fits(p, src) {
		return
	}
	s.metrics.TooLarge.Add(1)
	s.post(p, target{addr: src.addr}, nil)
}

// target is where a message goes.
type target struct {
	addr netip.AddrPort
	tcp  bool
	dial bool // over TCP, queue the message for a new connection when there is none
	// client is the client a request to a backend is from: to a backend
	// with proxy=, it goes over that client's connection (proxyout.go).
	client netip.AddrPort
}

var bufPool = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// sendMsg serializes m and sends it to t.
func (s *Server) sendMsg(m gosip.Message, t target) error {
	b := bufPool.Get().(*bytes.Buffer)
	b.Reset()
	m.StringWrite(b)
	err := s.sendBytes(b.Bytes(), t)
	bufPool.Put(b)
	return err
}

// post sends p to t without waiting for the result: in a read batch a
// UDP datagram joins the batch's queue (udpbatch.go), anything else is
// sent at once. ok, when not nil, counts the message if it left.
func (s *Server) post(p []byte, t target, ok *atomic.Uint64) {
	_ = s.postOr(p, t, ok, nil)
}

// postOr is post for a send whose failure has a handler: queued, onErr is
// called with the error after the batch's flush if it did not leave, and
// postOr returns nil; sent at once, postOr returns the error and onErr is
// not called (the caller handles it as before). errTooLarge is returned at
// once in both cases.
func (s *Server) postOr(p []byte, t target, ok *atomic.Uint64, onErr func(error)) error {
	if !t.tcp && s.udpOut != nil && s.udpOut.open.Load() {
		if len(p) > maxDatagram {
			s.metrics.Oversize.Add(1)
			return errTooLarge
		}
		if s.udpOut.queue(s, p, t.addr, ok, onErr) {
			return nil
		}
	}
	err := s.sendBytes(p, t)
	if err == nil && ok != nil {
		ok.Add(1)
	}
	return err
}

// postMsg serializes m and posts it to t.
func (s *Server) postMsg(m gosip.Message, t target, ok *atomic.Uint64) {
	_ = s.postMsgOr(m, t, ok, nil)
}

// postMsgOr serializes m and posts it to t as postOr does.
func (s *Server) postMsgOr(m gosip.Message, t target, ok *atomic.Uint64, onErr func(error)) error {
	b := bufPool.Get().(*bytes.Buffer)
	b.Reset()
	m.StringWrite(b)
	err := s.postOr(b.Bytes(), t, ok, onErr)
	bufPool.Put(b)
	return err
}

// maxDatagram is the largest UDP payload over IPv4.
const maxDatagram = 65507

// errTooLarge is sendBytes' error for a message larger than a datagram.
var errTooLarge = errors.New("send udp: message larger than a datagram")

// sendBytes sends one serialized message to t.
func (s *Server) sendBytes(p []byte, t target) error {
	if !t.tcp {
		if len(p) > maxDatagram {
			s.metrics.Oversize.Add(1)
			return errTooLarge
		}
		var err error
		handled := false
		if s.udpOut != nil {
			// In a read batch: what the batch queued leaves first.
			if handled, err = s.udpOut.sendNow(s, p, t.addr); handled {
				return err
			}
		}
		if s.udpRaw != nil {
			handled, err = s.udpRaw.send(p, t.addr)
		}
		if !handled {
			_, err = s.udp.WriteToUDPAddrPort(p, t.addr)
		}
		if err != nil {
			s.metrics.SendErrors.Add(1)
			return fmt.Errorf("send udp %s: %w", t.addr, err)
		}
		return nil
	}
	if t.client.IsValid() {
		if b := s.pool.Load().backendAt(t.addr); b != nil && b.spec.Proxy != 0 {
			if err := s.sendProxied(p, b, t.client); err != nil {
				if !errors.Is(err, errProxyConnsFull) {
					s.metrics.SendErrors.Add(1)
				}
				return fmt.Errorf("send tcp %s for %s: %w", t.addr, t.client, err)
			}
			return nil
		}
	}
	c := s.tcp.get(t.addr)
	if c == nil {
		// With dial, the message waits for a new connection. Without, a
		// backend still gets one opened (new work meanwhile fails over
		// rather than arriving twice), and a response whose client
		// connection is gone is dropped.
		if (t.dial || s.proxyBackend(t.addr)) && s.dialAsync(t.addr, p) {
			// A PROXY-protocol backend's shared connection carries
			// answers to its own requests: they wait for it too.
			return nil
		}
		if s.pool.Load().backendAt(t.addr) != nil {
			s.dialAsync(t.addr, nil)
		}
		s.metrics.SendErrors.Add(1)
		return fmt.Errorf("send tcp %s: no connection", t.addr)
	}
	if err := c.send(p); err != nil {
		s.metrics.SendErrors.Add(1)
		return fmt.Errorf("send tcp %s: %w", t.addr, err)
	}
	return nil
}

// replyTarget is where a response to req goes (RFC 3261 §18.2.2, RFC 3581):
// over TCP the connection it came on; over UDP the source address with the
// Via port, or the source port when the Via asks for rport.
func (s *Server) replyTarget(req *gosip.Request, src source) target {
	if src.conn != nil {
		return target{addr: src.addr, tcp: true}
	}
	port := src.addr.Port()
	if v := s.clientVia(req); v != nil {
		if _, rport := v.Params.Get("rport"); !rport && v.Port > 0 {
			port = uint16(v.Port)
		}
	}
	return target{addr: netip.AddrPortFrom(src.addr.Addr(), port)}
}

// clientVia is the top Via that is not ours: the client's, also after we
// added ours to a request we forward.
func (s *Server) clientVia(req *gosip.Request) *gosip.ViaHeader {
	v := req.Via()
	if v == nil || !s.ourViaHeader(v) {
		return v
	}
	for _, h := range req.Headers() {
		if vh, ok := h.(*gosip.ViaHeader); ok && !s.ourViaHeader(vh) {
			return vh
		}
	}
	return nil
}

// ourViaHeader reports whether v is a Via this balancer added.
func (s *Server) ourViaHeader(v *gosip.ViaHeader) bool {
	br, _ := v.Params.Get("branch")
	return strings.HasPrefix(br, ourBranchPrefix) && s.viaIsOurs(v)
}

func parsePort(s string) (int, error) {
	n := 0
	if s == "" || len(s) > 5 {
		return 0, errors.New("bad port")
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, errors.New("bad port")
		}
		n = n*10 + int(c-'0')
	}
	if n > 65535 {
		return 0, errors.New("bad port")
	}
	return n, nil
}

// tick drives transaction timers and the refusal summary.
func (s *Server) tick() {
	defer s.wg.Done()
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	var lastLog, lastFullLog time.Time
	var lastRefused, lastFull, lastForged uint64
	var tcpSeen tcpRefusalsSeen
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
		now := s.clock.Now()
		s.noteOwnDrops(now)
		s.txnTimers(now)
		s.expireWatched(now)
		s.sweepDialogLogs(now)
		s.dialogs.sweep(now, dialogSweepShards)
		s.dialogStoreTick(now)
		if f := s.metrics.DialogsFull.Load(); f != lastFull && time.Since(lastFullLog) >= time.Minute {
			lastFullLog = time.Now()
			s.log.Warn("sip dialog table full: new dialogs not recorded, their in-dialog requests without our Route go by Call-ID hash; raise -sip-dialog-max or lower -sip-dialog-ttl",
				"entries", s.dialogs.Len(), "max", s.cfg.DialogMax, "bytes", s.dialogs.Bytes(), "not_recorded_total", f, "since_last", f-lastFull)
			lastFull = f
		}
		if s.adm.Memory().State() == admission.Critical {
			s.abortNewWork(now)
		}
		if time.Since(lastLog) >= 10*time.Second {
			lastLog = time.Now()
			s.logTCPRefusals(&tcpSeen)
			s.logOwnDrops()
			if f := s.metrics.ForgedResponses.Load(); f != lastForged {
				s.log.Warn("sip responses dropped: their branch was not made for the address they came from (forged, or a peer answering from another socket)",
					"forged_responses_total", f, "since_last", f-lastForged)
				lastForged = f
			}
			r := s.metrics.Refused.Load()
			if r != lastRefused {
				s.log.Info("sip new work refused", "refused_total", r, "since_last", r-lastRefused,
					"malformed_total", s.metrics.Malformed.Load(), "forged_total", s.metrics.ForgedTokens.Load())
				lastRefused = r
			}
		}
	}
}
