package admin

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"net"
	"net/http"
	"strings"
	"unicode"

	"github.com/sluicelb/sluice/internal/opfile"
)

// Tokens are the bearer tokens the admin listener accepts, by name, read
// from -admin-token-file. The name of the token a request carried goes
// into the log and the event log with each change it makes.
type Tokens struct {
	file string
	list []token
}

type token struct {
	name string
	sum  [sha256.Size]byte // compared, never the token itself: equal lengths, constant time
}

// MinTokenLen is the shortest token accepted (16 bytes: e.g. the output of
// `openssl rand -hex 16` is 32).
const MinTokenLen = 16

// LoadTokens reads a token file: one "NAME TOKEN" a line, or a single
// token alone on its line (named "token"); blank lines and lines starting
// with # are skipped. Errors name the file and line.
func LoadTokens(path string) (*Tokens, error) {
	data, err := opfile.Read(path, opfile.MaxSize)
	if err != nil {
		return nil, fmt.Errorf("-admin-token-file: %w", err)
	}
	return ParseTokens(path, data)
}

// ParseTokens parses the content of a token file named file (for errors).
func ParseTokens(file string, data []byte) (*Tokens, error) {
	t := &Tokens{file: file}
	names := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for line := 1; sc.Scan(); line++ {
		f := strings.Fields(sc.Text())
		if len(f) == 0 || strings.HasPrefix(f[0], "#") {
			continue
		}
		var name, tok string
		switch len(f) {
		case 1:
			name, tok = "token", f[0]
		case 2:
			name, tok = f[0], f[1]
		default:
			return nil, fmt.Errorf("-admin-token-file %s:%d: want NAME TOKEN or a single token, got %d words", file, line, len(f))
		}
		if len(tok) < MinTokenLen || strings.ContainsFunc(tok, unicode.IsControl) {
			return nil, fmt.Errorf("-admin-token-file %s:%d: token %q is shorter than %d bytes (make one with: openssl rand -hex 16)", file, line, name, MinTokenLen)
		}
		if names[name] {
			return nil, fmt.Errorf("-admin-token-file %s:%d: token name %q given twice", file, line, name)
		}
		names[name] = true
		t.list = append(t.list, token{name: name, sum: sha256.Sum256([]byte(tok))})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("-admin-token-file %s: %w", file, err)
	}
	if len(t.list) == 0 {
		return nil, fmt.Errorf("-admin-token-file %s: no token in the file", file)
	}
	return t, nil
}

// Len returns the number of tokens.
func (t *Tokens) Len() int { return len(t.list) }

// constantTimeCompare is subtle.ConstantTimeCompare; a test counts its
// calls.
var constantTimeCompare = subtle.ConstantTimeCompare

// Check returns the name of the token presented, or false. Every token is
// compared, in constant time, whether or not an earlier one matched, so
// the time taken says nothing about which token or how much of it matched.
func (t *Tokens) Check(presented string) (string, bool) {
	sum := sha256.Sum256([]byte(presented))
	found := -1
	for i := range t.list {
		if constantTimeCompare(sum[:], t.list[i].sum[:]) == 1 && found < 0 {
			found = i
		}
	}
	if found < 0 {
		return "", false
	}
	return t.list[found].name, true
}

type tokenNameKey struct{}

// Caller describes who sent r: its remote address and, when tokens are
// on, "token NAME".
func Caller(r *http.Request) string {
	if name, ok := r.Context().Value(tokenNameKey{}).(string); ok {
		return r.RemoteAddr + " token " + name
	}
	return r.RemoteAddr
}

// RequireTokens makes every request but GET /healthz (load balancers'
// probes) present "Authorization: Bearer TOKEN" with one of t: 401
// without one, 403 with a token that is not in the file. Call it before
// Serve; nil turns the check off.
func (s *Server) RequireTokens(t *Tokens) {
	s.tokens.Store(t)
}

// ServeHTTP refuses framing, checks the Host (hosts.go), then the token
// when required, then serves from the mux.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// No page of another site may frame the dashboard: a click there
	// (drain, weight) would be the admin page's own, same-origin request.
	w.Header().Set("X-Frame-Options", "DENY")
	w.Header().Set("Content-Security-Policy", "frame-ancestors 'none'")
	if !s.checkHost(w, r) {
		return
	}
	t := s.tokens.Load()
	if t == nil || r.URL.Path == "/healthz" {
		s.mux.ServeHTTP(w, r)
		return
	}
	h := r.Header.Get("Authorization")
	scheme, presented, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(presented) == "" {
		w.Header().Set("WWW-Authenticate", `Bearer realm="sluice admin"`)
		http.Error(w, "this admin listener needs a token: send Authorization: Bearer TOKEN (sluice ctl -token-file FILE)", http.StatusUnauthorized)
		return
	}
	name, ok := t.Check(strings.TrimSpace(presented))
	if !ok {
		s.logger.Warn("admin request with an unknown token refused", "remote", r.RemoteAddr, "path", r.URL.Path)
		http.Error(w, "token not accepted: it is not in the admin listener's -admin-token-file", http.StatusForbidden)
		return
	}
	s.mux.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), tokenNameKey{}, name)))
}

// CheckListen refuses an admin address off loopback without a token file:
// the control endpoints change the node, so anyone who can reach them
// must prove who they are.
func CheckListen(addr, tokenFile string) error {
	if addr == "" || tokenFile != "" {
		return nil
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("-admin-listen %q: %w", addr, err)
	}
	if IsLoopback(host) {
		return nil
	}
	return fmt.Errorf("-admin-listen %s is not a loopback address: give -admin-token-file FILE too (one \"NAME TOKEN\" a line), or listen on 127.0.0.1", addr)
}

// IsLoopback reports whether host (a name or an address) is loopback:
// "localhost", 127.0.0.0/8 or ::1. An empty host (every interface) is not.
func IsLoopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
