package node

import "testing"

// Two of the node's listeners on one port failed at start with "bind:
// address already in use", as if another process held it. listenClash
// names both flags before anything listens.
func TestListenClash(t *testing.T) {
	tests := []struct {
		name string
		ls   []listener
		want string // "" no error
	}{
		{"distinct", []listener{{"-admin-listen", "127.0.0.1:9090", ""}, {"-sip-listen", ":5060", "its TCP listener"}, {"-sip-tls-listen", ":5061", ""}}, ""},
		{"same port other hosts", []listener{{"-admin-listen", "127.0.0.1:9090", ""}, {"-http-listen", "127.0.0.2:9090", ""}}, ""},
		{"port 0", []listener{{"-admin-listen", "127.0.0.1:0", ""}, {"-http-listen", "127.0.0.1:0", ""}}, ""},
		{"unparsable left to its own check", []listener{{"-admin-listen", "x", ""}, {"-http-listen", "x", ""}}, ""},
		{"same address", []listener{{"-sip-listen", "127.0.0.1:5060", "its TCP listener"}, {"-sip-tls-listen", "127.0.0.1:5060", ""}},
			"-sip-tls-listen 127.0.0.1:5060: -sip-listen 127.0.0.1:5060 (its TCP listener) listens on that port already: give each listener a port of its own"},
		{"wildcard and loopback", []listener{{"-admin-listen", "127.0.0.1:9090", ""}, {"-http-listen", ":9090", ""}},
			"-http-listen :9090: -admin-listen 127.0.0.1:9090 listens on that port already: give each listener a port of its own"},
		{"ipv6 wildcard", []listener{{"-sip-ws-listen", "[::]:8081", ""}, {"-sip-wss-listen", "10.0.0.1:8081", ""}},
			"-sip-wss-listen 10.0.0.1:8081: -sip-ws-listen [::]:8081 listens on that port already: give each listener a port of its own"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := listenClash(tt.ls)
			got := ""
			if err != nil {
				got = err.Error()
			}
			if got != tt.want {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}
