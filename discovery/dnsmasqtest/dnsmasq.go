// Package dnsmasqtest runs a real DNS server for tests: dnsmasq on a
// loopback high port, its records in a conf file and a hosts file. Hosts
// are changed by rewriting the file and SIGHUP (dnsmasq re-reads it);
// SRV, NAPTR and other conf records need Restart. Names under .test are
// local: a name it does not know is NXDOMAIN, not REFUSED.
package dnsmasqtest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// Server is one dnsmasq process serving the test's records.
type Server struct {
	// Addr is the server's 127.0.0.1:PORT (UDP and TCP).
	Addr  string
	t     testing.TB
	dir   string
	conf  string
	hosts string
	cmd   *exec.Cmd
	done  chan struct{}
	log   *syncBuffer
}

// syncBuffer is dnsmasq's output, written by the process's copier and
// read by the test.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.b.Len() > 64<<10 {
		return len(p), nil // enough to say why it failed
	}
	return b.b.Write(p)
}

func (b *syncBuffer) String() string { b.mu.Lock(); defer b.mu.Unlock(); return b.b.String() }

// Start runs dnsmasq with conf lines (e.g. "srv-host=_sip._udp.example.test,sip1.example.test,5060,10,60")
// and hosts (a hosts file's text) and waits until it answers. TTL is
// the TTL of every local record (local-ttl). The test is skipped when
// dnsmasq is not installed; the server stops at the test's end.
func Start(t testing.TB, ttl int, conf []string, hosts string) *Server {
	t.Helper()
	bin, err := exec.LookPath("dnsmasq")
	if err != nil {
		if _, e := os.Stat("/usr/sbin/dnsmasq"); e == nil {
			bin = "/usr/sbin/dnsmasq"
		} else {
			t.Skip("dnsmasq not installed (Debian: dnsmasq-base)")
		}
	}
	s := &Server{t: t, dir: t.TempDir()}
	s.hosts = filepath.Join(s.dir, "hosts")
	s.conf = filepath.Join(s.dir, "dnsmasq.conf")
	port := freePort(t)
	s.Addr = net.JoinHostPort("127.0.0.1", fmt.Sprint(port))
	lines := []string{
		fmt.Sprintf("port=%d", port), "listen-address=127.0.0.1", "bind-interfaces",
		"no-resolv", "no-hosts", "no-negcache", "local=/test/", "pid-file=", "user=", "log-facility=-",
		fmt.Sprintf("local-ttl=%d", ttl), "addn-hosts=" + s.hosts,
	}
	lines = append(lines, conf...)
	if err := os.WriteFile(s.conf, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	s.write(hosts)
	s.start(bin)
	t.Cleanup(s.Stop)
	return s
}

func (s *Server) start(bin string) {
	s.t.Helper()
	s.cmd = exec.Command(bin, "--no-daemon", "--conf-file="+s.conf)
	s.log = new(syncBuffer)
	s.cmd.Stdout, s.cmd.Stderr = s.log, s.log
	if err := s.cmd.Start(); err != nil {
		s.t.Fatalf("start dnsmasq: %v", err)
	}
	s.done = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) { cmd.Wait(); close(done) }(s.cmd, s.done)
	s.waitReady()
}

func freePort(t testing.TB) int {
	for range 20 {
		u, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := u.LocalAddr().(*net.UDPAddr).Port
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		u.Close()
		if err == nil {
			l.Close()
			return port
		}
	}
	t.Fatal("no free port for dnsmasq")
	return 0
}

// waitReady waits until the server answers a query (any answer).
func (s *Server) waitReady() {
	s.t.Helper()
	c := &dns.Client{Net: "udp", Timeout: 200 * time.Millisecond}
	m := new(dns.Msg)
	m.SetQuestion("ready.invalid.", dns.TypeA)
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-s.done:
			s.t.Fatalf("dnsmasq exited at start (conf %s): %s", s.conf, s.log.String())
		default:
		}
		if _, _, err := c.ExchangeContext(context.Background(), m, s.Addr); err == nil {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	s.t.Fatalf("dnsmasq on %s did not answer in 10s", s.Addr)
}

func (s *Server) write(hosts string) {
	tmp := s.hosts + ".tmp"
	if err := os.WriteFile(tmp, []byte(hosts), 0o644); err != nil {
		s.t.Fatal(err)
	}
	if err := os.Rename(tmp, s.hosts); err != nil {
		s.t.Fatal(err)
	}
}

// SetHosts replaces the hosts file and has dnsmasq re-read it (SIGHUP
// to its PID); it returns once a query for probe (a name of the new file
// with the address want, or "" to skip) gets the new answer.
func (s *Server) SetHosts(hosts, probe, want string) {
	s.t.Helper()
	s.write(hosts)
	if err := s.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		s.t.Fatalf("SIGHUP dnsmasq: %v", err)
	}
	if probe == "" {
		return
	}
	c := &dns.Client{Net: "udp", Timeout: 200 * time.Millisecond}
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(probe), dns.TypeA)
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if in, _, err := c.ExchangeContext(context.Background(), m, s.Addr); err == nil {
			for _, rr := range in.Answer {
				if a, ok := rr.(*dns.A); ok && a.A.String() == want {
					return
				}
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	s.t.Fatalf("dnsmasq did not serve %s -> %s after SIGHUP", probe, want)
}

// Stop ends dnsmasq (SIGTERM to its PID) and waits for it. Stop twice
// does nothing more.
func (s *Server) Stop() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	select {
	case <-s.done:
		return
	default:
	}
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(5 * time.Second):
		s.cmd.Process.Kill()
		<-s.done
	}
}

// Restart stops dnsmasq and starts it again on the same port with the
// same files.
func (s *Server) Restart() {
	s.t.Helper()
	s.Stop()
	s.start(s.cmd.Path)
}
