package sip

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"hash"
	"sync"
)

// A flow token (RFC 5626 §5.2) names one client connection of one node:
//
//	hex( V | NODE | L | GEN | CONN | MAC )
//
// V (1 byte) is flowTokenVersion; NODE (4 bytes) the node that holds the
// connection (flowNode: a hash of its advertised address); L (1 byte) the
// listener the connection came in on (listenerMain for the UDP/TCP port);
// GEN (4 bytes) the flow table's generation, drawn at random when the
// server is built, so the connection ids of an earlier process (which
// start again from 1) name nothing; CONN (8 bytes) the connection's id,
// never reused within a generation; MAC (12 bytes, 96 bits) is
// HMAC-SHA256 of the 18 bytes before it, under a key derived from the
// affinity key ring (lb.Signer.DeriveKey, label flowKeyLabel), so every
// node sharing the ring can tell its own tokens, and another node's, from
// forgeries.
//
// It goes in the user part of our client-facing Record-Route and of the
// Path we add to REGISTER (as RFC 5626 edge proxies do), and in the
// signed Contact alias (-sip-contact-alias). It holds no expiry: it is
// good exactly as long as the connection lives, whatever the Expires of
// a registration that carries it. Lowercase hex never spells "cseq"
// (token.go says why that matters), and it survives any case folding.
const (
	flowTokenVersion = 1
	flowTokenBody    = 1 + 4 + 1 + 4 + 8
	flowTokenMACLen  = 12
	// flowTokenLen is the length of every flow token in characters; any
	// other length is refused before any work is done.
	flowTokenLen = 2 * (flowTokenBody + flowTokenMACLen)
)

// flowKeyLabel names the flow token MAC key among the keys derived from
// the affinity key ring.
const flowKeyLabel = "sluice sip flow token mac v1"

// flowRef is what a flow token names.
type flowRef struct {
	node     uint32
	listener uint8
	gen      uint32
	conn     uint64
}

// flowSigner makes and checks flow tokens. Safe for concurrent use.
type flowSigner struct {
	pool sync.Pool // hash.Hash (HMAC-SHA256 under the flow key)
}

// newFlowSigner keys flow tokens from signer's key ring when it can
// derive keys (*lb.Signer), else from a random key for this process:
// tokens then die with it, as the connections they name do anyway.
func newFlowSigner(signer Signer) *flowSigner {
	var key []byte
	if d, ok := signer.(KeyDeriver); ok {
		key = d.DeriveKey(flowKeyLabel)
	} else {
		key = make([]byte, 32)
		_, _ = rand.Read(key)
	}
	return newFlowSignerKey(key)
}

// newFlowSignerKey returns a flowSigner with the given MAC key.
func newFlowSignerKey(key []byte) *flowSigner {
	k := append([]byte(nil), key...)
	f := &flowSigner{}
	f.pool.New = func() any { return hmac.New(sha256.New, k) }
	return f
}

// body writes the signed part of r's token into b.
func (r flowRef) body(b *[flowTokenBody]byte) {
	b[0] = flowTokenVersion
	binary.BigEndian.PutUint32(b[1:5], r.node)
	b[5] = r.listener
	binary.BigEndian.PutUint32(b[6:10], r.gen)
	binary.BigEndian.PutUint64(b[10:18], r.conn)
}

// mac writes the MAC of body into out.
func (f *flowSigner) mac(body []byte, out *[sha256.Size]byte) {
	h := f.pool.Get().(hash.Hash)
	h.Reset()
	h.Write(body)
	h.Sum(out[:0])
	f.pool.Put(h)
}

// encode returns the token naming r.
func (f *flowSigner) encode(r flowRef) string {
	var raw [flowTokenBody + flowTokenMACLen]byte
	var body [flowTokenBody]byte
	r.body(&body)
	copy(raw[:], body[:])
	var sum [sha256.Size]byte
	f.mac(body[:], &sum)
	copy(raw[flowTokenBody:], sum[:flowTokenMACLen])
	return hex.EncodeToString(raw[:])
}

// decode checks tok and returns the flow it names. ok is false for
// anything this signer did not make: a wrong length (checked first, so
// no input costs more than one token's work), a character that is not
// hex, another version, a MAC that does not match (compared in constant
// time).
func (f *flowSigner) decode(tok string) (r flowRef, ok bool) {
	if len(tok) != flowTokenLen {
		return flowRef{}, false
	}
	var raw [flowTokenBody + flowTokenMACLen]byte
	if _, err := hex.Decode(raw[:], []byte(tok)); err != nil {
		return flowRef{}, false
	}
	var sum [sha256.Size]byte
	f.mac(raw[:flowTokenBody], &sum)
	if !hmac.Equal(sum[:flowTokenMACLen], raw[flowTokenBody:]) || raw[0] != flowTokenVersion {
		return flowRef{}, false
	}
	r.node = binary.BigEndian.Uint32(raw[1:5])
	r.listener = raw[5]
	r.gen = binary.BigEndian.Uint32(raw[6:10])
	r.conn = binary.BigEndian.Uint64(raw[10:18])
	return r, true
}
