package sip

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"hash"
	"net/netip"
	"strconv"
	"sync"

	gosip "github.com/emiago/sipgo/sip"
)

// The branch of every Via we add to a forwarded request is
//
//	z9hG4bKslp | T | LOOP | MAC
//
// T is 't' when the request came over TCP and 'u' over UDP, so the
// response goes back on the transport the request came on whatever the
// client's Via says (RFC 3261 §18.2.2). LOOP (16 hex digits) is the loop
// detection hash of the request (RFC 3261 §16.6 step 8, loopHash). MAC
// (24 hex digits, 96 bits) is HMAC-SHA256, under a key derived from the
// affinity key ring, of T, LOOP, the client transaction key (the client's
// branch and sent-by, and the address and transport it really came from)
// and the address and transport the request was sent to.
//
// A response is accepted only if its branch's MAC is the one computed
// from its own next Via (whose received and rport we set from the real
// source) and from the address and transport it came from. So nobody
// who has not seen the request we sent can answer it, and nobody can
// answer it from anywhere but where it went: a forged 503 cannot drain a
// backend and a forged 200 is neither relayed nor taken for an answer.
//
// The branch is deterministic, as RFC 3261 §16.11 wants of a stateless
// proxy: the CANCEL of an INVITE, and the ACK of a non-2xx answer, from
// the same source reach the same backend transaction.
const (
	branchLoopLen = 16
	branchMACLen  = 24
	branchLen     = len(proxyBranchPrefix) + 1 + branchLoopLen + branchMACLen
)

// branchKeyLabel names the branch MAC key among the keys derived from the
// affinity key ring.
const branchKeyLabel = "sluice sip via branch mac v1"

// KeyDeriver is implemented by signers that can derive keys for other
// uses from their key ring (*lb.Signer does). The branch MAC key comes
// from it; a Signer without it gets a random key per process, so branches
// then differ after a restart.
type KeyDeriver interface {
	DeriveKey(label string) []byte
}

// brancher computes and checks our branches. Safe for concurrent use.
type brancher struct {
	pool sync.Pool // *branchScratch
}

type branchScratch struct {
	mac hash.Hash
	buf []byte
	sum [sha256.Size]byte
}

func newBrancher(signer Signer) *brancher {
	var key []byte
	if d, ok := signer.(KeyDeriver); ok {
		key = d.DeriveKey(branchKeyLabel)
	} else {
		key = make([]byte, 32)
		_, _ = rand.Read(key)
	}
	br := &brancher{}
	br.pool.New = func() any {
		return &branchScratch{mac: hmac.New(sha256.New, key), buf: make([]byte, 0, 256)}
	}
	return br
}

// clientTxn identifies the client transaction of a request (RFC 3261
// §17.2.3) together with where it really came from: the top Via's branch
// and sent-by (or, for RFC 2543 clients without the magic cookie, Call-ID
// and CSeq number) plus the source address and transport. INVITE, its
// CANCEL and the ACK of a non-2xx answer share it only when they come from
// the same place.
type clientTxn struct {
	branch  string // the client's branch, or "" for RFC 2543
	host    string // sent-by, lower case
	port    int
	callID  string // RFC 2543 only
	seq     uint32 // RFC 2543 only
	src     netip.AddrPort
	tcp     bool
	rfc2543 bool
}

// clientTxnOf returns the client transaction of a request from src.
func clientTxnOf(req *gosip.Request, src source) clientTxn {
	return clientTxnVia(req, req.Via(), src.addr, src.conn != nil)
}

// clientTxnVia is clientTxnOf for the Via v of message m and a given source.
func clientTxnVia(m gosip.Message, v *gosip.ViaHeader, src netip.AddrPort, tcp bool) clientTxn {
	var callID string
	var seq uint32
	if cid := m.CallID(); cid != nil {
		callID = string(*cid)
	}
	if cs := m.CSeq(); cs != nil {
		seq = cs.SeqNo
	}
	return clientTxnOfVia(v, src, tcp, callID, seq)
}

// clientTxnOfVia is clientTxnVia with the message's Call-ID and CSeq
// number given (read only for a Via without an RFC 3261 branch).
func clientTxnOfVia(v *gosip.ViaHeader, src netip.AddrPort, tcp bool, callID string, seq uint32) clientTxn {
	br, _ := v.Params.Get("branch")
	return clientTxnOfSentBy(v.Host, v.Port, br, src, tcp, callID, seq)
}

// clientTxnOfSentBy is clientTxnOfVia for a Via's host, port and branch.
func clientTxnOfSentBy(host string, port int, br string, src netip.AddrPort, tcp bool, callID string, seq uint32) clientTxn {
	k := clientTxn{host: host, port: port, src: src, tcp: tcp}
	for i := 0; i < len(k.host); i++ {
		if c := k.host[i]; c >= 'A' && c <= 'Z' {
			k.host = toLowerASCII(k.host)
			break
		}
	}
	if len(br) >= len(magicCookie) && br[:len(magicCookie)] == magicCookie {
		k.branch = br
	} else {
		k.rfc2543 = true
		k.callID = callID
		k.seq = seq
	}
	return k
}

func toLowerASCII(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c >= 'A' && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}

// key is the transaction table key of k.
func (k clientTxn) key() string {
	var b []byte
	if k.rfc2543 {
		b = make([]byte, 0, 48+len(k.callID)+len(k.host))
		b = append(b, "2543|"...)
		b = append(b, k.callID...)
		b = append(b, '|')
		b = strconv.AppendUint(b, uint64(k.seq), 10)
	} else {
		b = make([]byte, 0, 48+len(k.branch)+len(k.host))
		b = append(b, k.branch...)
	}
	b = append(b, '|')
	b = append(b, k.host...)
	b = append(b, ':')
	b = strconv.AppendInt(b, int64(k.port), 10)
	b = append(b, '|')
	b = k.src.AppendTo(b)
	if k.tcp {
		b = append(b, "|t"...)
	} else {
		b = append(b, "|u"...)
	}
	return string(b)
}

// appendField appends s with its length, so no two field lists encode
// alike.
func appendField(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// mac computes the MAC part of a branch into sc.sum.
func (br *brancher) mac(sc *branchScratch, tr byte, loop string, k *clientTxn, dst target) []byte {
	b := sc.buf[:0]
	b = append(b, tr)
	b = appendField(b, loop)
	if k.rfc2543 {
		b = append(b, 1)
		b = appendField(b, k.callID)
		b = binary.BigEndian.AppendUint32(b, k.seq)
	} else {
		b = append(b, 0)
		b = appendField(b, k.branch)
	}
	b = appendField(b, k.host)
	b = binary.BigEndian.AppendUint32(b, uint32(k.port))
	b = appendAddr(b, k.src, k.tcp)
	b = appendAddr(b, dst.addr, dst.tcp)
	sc.mac.Reset()
	sc.mac.Write(b)
	if cap(b) <= maxScratch {
		sc.buf = b // a client's huge branch is not kept in the pool
	}
	return sc.mac.Sum(sc.sum[:0])
}

// maxScratch bounds the MAC input buffer a pooled scratch keeps.
const maxScratch = 1024

func appendAddr(b []byte, a netip.AddrPort, tcp bool) []byte {
	ip := a.Addr().As16()
	b = append(b, ip[:]...)
	b = binary.BigEndian.AppendUint16(b, a.Port())
	if tcp {
		return append(b, 't')
	}
	return append(b, 'u')
}

const hexDigits = "0123456789abcdef"

// branch returns our branch for the client transaction k, with loop hash
// loop, sent to dst.
func (br *brancher) branch(k *clientTxn, loop uint64, dst target) string {
	var out [branchLen]byte
	n := copy(out[:], proxyBranchPrefix)
	tr := byte('u')
	if k.tcp {
		tr = 't'
	}
	out[n] = tr
	n++
	for i := branchLoopLen - 1; i >= 0; i-- {
		out[n+i] = hexDigits[loop&15]
		loop >>= 4
	}
	loopHex := out[n : n+branchLoopLen]
	n += branchLoopLen
	sc := br.pool.Get().(*branchScratch)
	sum := br.mac(sc, tr, string(loopHex), k, dst)
	for i := 0; i < branchMACLen/2; i++ {
		out[n+2*i] = hexDigits[sum[i]>>4]
		out[n+2*i+1] = hexDigits[sum[i]&15]
	}
	br.pool.Put(sc)
	return string(out[:])
}

// parse splits one of our proxy branches into its transport flag and loop
// hash; ok is false if b does not have our shape.
func parseBranch(b string) (tcp bool, loop string, ok bool) {
	if len(b) != branchLen || b[:len(proxyBranchPrefix)] != proxyBranchPrefix {
		return false, "", false
	}
	n := len(proxyBranchPrefix)
	switch b[n] {
	case 't':
		tcp = true
	case 'u':
	default:
		return false, "", false
	}
	for i := n + 1; i < len(b); i++ {
		if c := b[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false, "", false
		}
	}
	return tcp, b[n+1 : n+1+branchLoopLen], true
}

// verify reports whether b is the branch we made for the client
// transaction k sent to dst. It compares in constant time.
func (br *brancher) verify(b string, k *clientTxn, dst target) bool {
	tcp, loop, ok := parseBranch(b)
	if !ok || tcp != k.tcp {
		return false
	}
	tr := byte('u')
	if tcp {
		tr = 't'
	}
	sc := br.pool.Get().(*branchScratch)
	sum := br.mac(sc, tr, loop, k, dst)
	var want [branchMACLen]byte
	for i := 0; i < branchMACLen/2; i++ {
		want[2*i] = hexDigits[sum[i]>>4]
		want[2*i+1] = hexDigits[sum[i]&15]
	}
	br.pool.Put(sc)
	return hmac.Equal(want[:], []byte(b[len(b)-branchMACLen:]))
}

// loopHash is the part of a request's identity that does not change as it
// is forwarded (RFC 3261 §16.6 step 8): Request-URI, Call-ID, From and To
// tags and CSeq number. A request that comes back to us with a Via of ours
// whose branch carries the same hash has looped (§16.3 step 4). The CSeq
// method is left out so a CANCEL matches its INVITE.
func loopHash(req *gosip.Request) uint64 {
	buf := bufPool.Get().(*bytes.Buffer)
	buf.Reset()
	req.Recipient.StringWrite(buf)
	var from string
	f := header(req, "from", "f")
	if f != nil {
		from = tagParam(f.Value())
	}
	h := loopHashOf(buf.Bytes(), req.CallID().Value(), f != nil, from, toTag(req), req.CSeq().SeqNo)
	bufPool.Put(buf)
	return h
}

// loopHashOf is loopHash of a request whose Request-URI is written as uri,
// with that Call-ID, From (hasFrom: a From header at all) and To tags and
// CSeq number.
func loopHashOf(uri []byte, callID string, hasFrom bool, fromTag, toTag string, seq uint32) uint64 {
	h := fnv64b(fnvOffset, uri)
	h = fnv64(h^0xff, callID)
	if hasFrom {
		h = fnv64(h^0xff, fromTag)
	}
	h = fnv64(h^0xff, toTag)
	var num [10]byte
	return fnv64b(h^0xff, strconv.AppendUint(num[:0], uint64(seq), 10))
}

// fnv64b is fnv64 over b.
func fnv64b(h uint64, b []byte) uint64 {
	for _, c := range b {
		h ^= uint64(c)
		h *= 1099511628211
	}
	return h
}

// looped reports whether req carries a Via of ours whose branch holds
// req's loop hash: we forwarded this very request before. The hash is
// only computed when a Via of ours is there.
func (s *Server) looped(req *gosip.Request) bool {
	var want [branchLoopLen]byte
	hashed := false
	for _, hd := range req.Headers() {
		v, ok := hd.(*gosip.ViaHeader)
		if !ok {
			continue
		}
		b, _ := v.Params.Get("branch")
		_, loop, ok := parseBranch(b)
		if !ok || !s.viaIsOurs(v) {
			continue
		}
		if !hashed {
			h := loopHash(req)
			for i := branchLoopLen - 1; i >= 0; i-- {
				want[i] = hexDigits[h&15]
				h >>= 4
			}
			hashed = true
		}
		if loop == string(want[:]) {
			return true
		}
	}
	return false
}
