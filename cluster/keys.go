package cluster

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"

	"github.com/sluicelb/sluice/lb"
)

// MOPStateKeyLabel is the use the affinity key ring's keys are derived for
// (lb.DeriveKeys) to sign a learner's MOP state in Redis.
const MOPStateKeyLabel = "sluice cluster mop state v1"

// keySet signs values with the newest of a key ring's derived keys and
// checks them against every key of the ring.
type keySet struct {
	newest lb.Key
	keys   [256][]byte // by key id; nil: not in the ring
}

func newKeySet(ring []lb.Key, label string) (*keySet, error) {
	if len(ring) == 0 {
		return nil, fmt.Errorf("%w: no keys", ErrConfig)
	}
	keys, err := lb.DeriveKeys(ring, label)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	s := &keySet{newest: keys[len(keys)-1]}
	for _, k := range keys {
		s.keys[k.ID] = k.Secret
	}
	return s, nil
}

func macOf(key []byte, context, value string) []byte {
	h := hmac.New(sha256.New, key)
	h.Write([]byte(context))
	h.Write([]byte{'\n'})
	h.Write([]byte(value))
	return h.Sum(nil)
}

// seal returns "s1 KEYID HEXMAC\nVALUE", the MAC over context and value.
func (s *keySet) seal(context, value string) string {
	return "s1 " + strconv.Itoa(int(s.newest.ID)) + " " + hex.EncodeToString(macOf(s.newest.Secret, context, value)) + "\n" + value
}

// open returns the value sealed in v for context, or false when v is not
// sealed by a key of the set for context.
func (s *keySet) open(context, v string) (string, bool) {
	head, value, ok := strings.Cut(v, "\n")
	if !ok || !strings.HasPrefix(head, "s1 ") {
		return "", false
	}
	id, sig, ok := strings.Cut(head[3:], " ")
	n, err := strconv.ParseUint(id, 10, 8)
	if !ok || err != nil || s.keys[n] == nil {
		return "", false
	}
	got, err := hex.DecodeString(sig)
	if err != nil || !hmac.Equal(got, macOf(s.keys[n], context, value)) {
		return "", false
	}
	return value, true
}

// SetKeyRing gives the node the affinity key ring every node shares: from
// then on the learner's MOP state is written sealed with a key derived
// from it (HMAC-SHA256, bound to the backend's key), and a state in Redis
// is imported only when sealed by a key of the ring, so a Redis client
// without the key file cannot make the nodes import a rate, however
// plausible. Without a ring states are range-checked only. Call it before
// Run.
func (c *Cluster) SetKeyRing(ring []lb.Key) error {
	ks, err := newKeySet(ring, MOPStateKeyLabel)
	if err != nil {
		return err
	}
	c.stateKeys.Store(ks)
	return nil
}
