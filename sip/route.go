package sip

import (
	"strconv"
	"strings"

	gosip "github.com/emiago/sipgo/sip"
)

// RFC 3261 magic cookie that starts every compliant branch.
const magicCookie = "z9hG4bK"

// ourBranchPrefix starts the branch of every Via we add, so a response is
// recognised as ours before any table lookup. "slp" marks proxied requests,
// "slh" health pings.
const (
	ourBranchPrefix   = magicCookie + "sl"
	proxyBranchPrefix = ourBranchPrefix + "p"
	pingBranchPrefix  = ourBranchPrefix + "h"
)

// tokenParam is the Record-Route URI parameter carrying the sealed token.
const tokenParam = "sl"

// localTagPrefix starts every To-tag of a final response the balancer
// generates itself (503, 500, 483, ...), so the ACK for it is absorbed
// without state.
const localTagPrefix = "sluice-"

// fnv64 is FNV-1a over s, continuing from h (start with fnvOffset).
func fnv64(h uint64, s string) uint64 {
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}

const fnvOffset = 14695981039346656037

// tokenSubject binds a token to the backend and to the dialog's Call-ID,
// so a token copied from one call is no pass for another.
func tokenSubject(backendID, callID string) string {
	return backendID + "|" + strconv.FormatUint(fnv64(fnvOffset, callID), 36)
}

// splitSubject is the inverse of tokenSubject: it returns the backend id if
// the subject was made for callID.
func splitSubject(subject, callID string) (string, bool) {
	i := strings.LastIndexByte(subject, '|')
	if i < 0 {
		return "", false
	}
	if subject[i+1:] != strconv.FormatUint(fnv64(fnvOffset, callID), 36) {
		return "", false
	}
	return subject[:i], true
}

// toTag returns the To tag, or "" when there is none.
func toTag(m gosip.Message) string {
	to := m.To()
	if to == nil {
		return ""
	}
	t, _ := to.Params.Get("tag")
	return t
}

// dialogCreating reports whether a request of this method can create a
// dialog or a subscription (RFC 3261 §12, RFC 6665, RFC 3515); those are
// the methods a made-up To-tag must not carry past admission.
func dialogCreating(m gosip.RequestMethod) bool {
	switch m {
	case gosip.ACK, gosip.BYE, gosip.CANCEL, gosip.PRACK, gosip.UPDATE, gosip.INFO:
		return false
	}
	return true
}

// recordRoutes reports whether we add a Record-Route to a request of this
// method: the methods that create dialogs (RFC 3261 §16.6 step 4).
func recordRoutes(m gosip.RequestMethod) bool {
	switch m {
	case gosip.INVITE, gosip.SUBSCRIBE, gosip.REFER, gosip.NOTIFY:
		return true
	}
	return false
}

// uriPort is the port of u, defaulted by scheme.
func uriPort(u *gosip.Uri) int {
	if u.Port > 0 {
		return u.Port
	}
	if strings.EqualFold(u.Scheme, "sips") {
		return 5061
	}
	return 5060
}
