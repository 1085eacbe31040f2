package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicelb/sluice/node"
)

// freeTCPPort returns a loopback TCP port free at the time of the call.
func freeTCPPort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// startTool runs a real component in the foreground, stopped by its PID
// when the test ends; its output goes to a file (a pipe would keep Wait
// waiting on any child that inherited it), logged on failure.
func startTool(t *testing.T, name string, args ...string) {
	t.Helper()
	cmd := exec.Command(name, args...)
	out, err := os.CreateTemp(t.TempDir(), filepath.Base(name)+"-*.log")
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		out.Close()
		if t.Failed() {
			b, _ := os.ReadFile(out.Name())
			t.Logf("%s output:\n%s", name, b)
		}
	})
}

// waitListening waits until addr accepts connections.
func waitListening(t *testing.T, addr string) {
	t.Helper()
	for range 500 {
		if c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond); err == nil {
			c.Close()
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("%s never listened", addr)
}

// getFrom sends GET / to addr from the local address src (a loopback
// address other than 127.0.0.1: the client's own), after pre (a PROXY
// header, or nothing); it returns the body, or "" when the connection was
// closed unanswered, and the client's port.
func getFrom(t *testing.T, src, addr, pre string) (string, int) {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(c, pre+"GET / HTTP/1.1\r\nHost: pp.test\r\nConnection: close\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return "", c.LocalAddr().(*net.TCPAddr).Port
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return strings.TrimSpace(string(b)), c.LocalAddr().(*net.TCPAddr).Port
}

// TestProxyProtocolInterop: HAProxy in TCP mode (send-proxy-v2, and
// send-proxy for v1) in front of sluice (-proxy-protocol-from its
// address), nginx behind it reading the PROXY protocol sluice writes
// (-http-backend ADDR,proxy=v1|v2) and echoing what it read: a client at
// 127.0.0.2 arrives at nginx as 127.0.0.2 with its own port, in the PROXY
// header and in X-Forwarded-For; a SIP client at 127.0.0.2 through HAProxy
// (send-proxy-v2) to sluice's SIP TCP listener arrives at its backend with
// Via received=127.0.0.2 and its port as rport, and gets the 200 back
// through HAProxy. A client connecting to sluice directly
// from 127.0.0.3 with a forged header is closed unanswered; without one it
// is served as itself.
func TestProxyProtocolInterop(t *testing.T) {
	haproxy := needTool(t, "haproxy")
	nginx := needTool(t, "nginx")
	dir := t.TempDir()

	// nginx: one server per PROXY version it is sent, echoing the
	// address the header carried, the address it took as the client's
	// (real_ip from the header) and X-Forwarded-For.
	nginxV1, nginxV2 := freeTCPPort(t), freeTCPPort(t)
	conf := fmt.Sprintf(`daemon off;
master_process off;
pid %[1]s/nginx.pid;
error_log stderr;
events { worker_connections 64; }
http {
	access_log off;
	client_body_temp_path %[1]s; proxy_temp_path %[1]s; fastcgi_temp_path %[1]s; uwsgi_temp_path %[1]s; scgi_temp_path %[1]s;
	set_real_ip_from 127.0.0.0/8;
	real_ip_header proxy_protocol;
	server {
		listen 127.0.0.1:%[2]d proxy_protocol;
		location / { return 200 "v1 pp=$proxy_protocol_addr:$proxy_protocol_port client=$remote_addr xff=$http_x_forwarded_for\n"; }
	}
	server {
		listen 127.0.0.1:%[3]d proxy_protocol;
		location / { return 200 "v2 pp=$proxy_protocol_addr:$proxy_protocol_port client=$remote_addr xff=$http_x_forwarded_for\n"; }
	}
}
`, dir, nginxV1, nginxV2)
	if err := os.WriteFile(filepath.Join(dir, "nginx.conf"), []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	startTool(t, nginx, "-p", dir, "-c", filepath.Join(dir, "nginx.conf"), "-e", "stderr")
	waitListening(t, fmt.Sprintf("127.0.0.1:%d", nginxV2))

	// A SIP backend over UDP that keeps the INVITEs it gets and answers 200.
	uas, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer uas.Close()
	invites := make(chan string, 8)
	go func() {
		buf := make([]byte, 65536)
		for {
			n, from, err := uas.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			msg := string(buf[:n])
			if strings.HasPrefix(msg, "INVITE ") {
				invites <- msg
			}
			if res := sipAnswer(msg, uas.LocalAddr().String()); res != "" {
				uas.WriteToUDPAddrPort([]byte(res), from)
			}
		}
	}()

	// sluice: a pool per version it writes, the v1 one routed by a header.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sipAddr := make(chan net.Addr, 1)
	ready := make(chan net.Addr, 1)
	exit := make(chan int, 1)
	var stderr syncBuffer
	args := []string{
		"-http-listen", "127.0.0.1:0", "-admin-listen", "", "-data-dir", t.TempDir(), "-drain-timeout", "1s",
		"-proxy-protocol-from", "127.0.0.1/32",
		"-http-backend", fmt.Sprintf("127.0.0.1:%d,proxy=v1,pool=v1", nginxV1),
		"-http-backend", fmt.Sprintf("127.0.0.1:%d,proxy=v2", nginxV2),
		"-http-route", "pool=v1,header=X-PP:v1",
		"-sip-listen", "127.0.0.1:0", "-sip-backend", uas.LocalAddr().String(), "-sip-health-interval", "0",
	}
	go func() {
		exit <- run(ctx, args, io.Discard, &stderr, &runHooks{ready: func(h, _ net.Addr) { ready <- h }, addrs: func(a node.Addrs) { sipAddr <- a.SIP }})
	}()
	var sluice net.Addr
	select {
	case sluice = <-ready:
	case code := <-exit:
		t.Fatalf("run exited %d: %s", code, stderr.String())
	}
	defer func() {
		if t.Failed() {
			t.Logf("sluice log:\n%s", stderr.String())
		}
	}()

	sipTCP := <-sipAddr

	// HAProxy: one frontend per version it sends sluice, one for SIP.
	hV2, hV1, hSIP := freeTCPPort(t), freeTCPPort(t), freeTCPPort(t)
	hcfg := fmt.Sprintf(`global
	log stderr format raw local0 warning
defaults
	mode tcp
	timeout connect 2s
	timeout client 10s
	timeout server 10s
frontend v2
	bind 127.0.0.1:%d
	default_backend sluice_v2
frontend v1
	bind 127.0.0.1:%d
	default_backend sluice_v1
backend sluice_v2
	server s %s send-proxy-v2
frontend sip
	bind 127.0.0.1:%d
	default_backend sluice_sip
backend sluice_v1
	server s %s send-proxy
backend sluice_sip
	server s %s send-proxy-v2
`, hV2, hV1, sluice, hSIP, sluice, sipTCP)
	if err := os.WriteFile(filepath.Join(dir, "haproxy.cfg"), []byte(hcfg), 0o600); err != nil {
		t.Fatal(err)
	}
	startTool(t, haproxy, "-f", filepath.Join(dir, "haproxy.cfg"), "-db")
	waitListening(t, fmt.Sprintf("127.0.0.1:%d", hV1))

	for _, tc := range []struct {
		name, via string
		out       string // the version sluice writes to nginx
	}{
		{"haproxy v2, sluice v2", fmt.Sprintf("127.0.0.1:%d", hV2), "v2"},
		{"haproxy v1, sluice v2", fmt.Sprintf("127.0.0.1:%d", hV1), "v2"},
		{"haproxy v2, sluice v1", fmt.Sprintf("127.0.0.1:%d", hV2), "v1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body, port := getFromWith(t, "127.0.0.2", tc.via, "", tc.out == "v1")
			want := fmt.Sprintf("%s pp=127.0.0.2:%d client=127.0.0.2 xff=127.0.0.2", tc.out, port)
			if body != want {
				t.Fatalf("nginx answered %q, want %q", body, want)
			}
		})
	}
	t.Run("sip over tcp through haproxy v2", func(t *testing.T) {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}, Timeout: 5 * time.Second}
		c, err := d.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", hSIP))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		la := c.LocalAddr().(*net.TCPAddr)
		fmt.Fprintf(c, "INVITE sip:svc@%s SIP/2.0\r\nVia: SIP/2.0/TCP %s;branch=z9hG4bK-pp-interop;rport\r\nMax-Forwards: 70\r\nFrom: <sip:a@test>;tag=a\r\nTo: <sip:svc@test>\r\nCall-ID: pp-interop@test\r\nCSeq: 1 INVITE\r\nContact: <sip:a@%s;transport=tcp>\r\nContent-Length: 0\r\n\r\n", sipTCP, la, la)
		var inv string
		select {
		case inv = <-invites:
		case <-time.After(10 * time.Second):
			t.Fatal("the INVITE never reached the backend")
		}
		var via string
		for _, l := range strings.Split(inv, "\r\n") {
			if strings.Contains(l, "z9hG4bK-pp-interop") {
				via = l
			}
		}
		if want := fmt.Sprintf("received=127.0.0.2;rport=%d", la.Port); !strings.Contains(via, "received=127.0.0.2") || !strings.Contains(via, fmt.Sprintf("rport=%d", la.Port)) {
			t.Fatalf("client Via at the backend %q, want %s", via, want)
		}
		// The 200 comes back to the client through HAProxy.
		br := bufio.NewReader(c)
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				t.Fatalf("waiting for the 200: %v", err)
			}
			if strings.HasPrefix(line, "SIP/2.0 200") {
				break
			}
		}
	})
	t.Run("forged header from an untrusted source", func(t *testing.T) {
		body, _ := getFrom(t, "127.0.0.3", sluice.String(), "PROXY TCP4 198.51.100.66 127.0.0.1 1234 80\r\n")
		if body != "" {
			t.Fatalf("a forged header was served: nginx answered %q", body)
		}
	})
	t.Run("untrusted source without header", func(t *testing.T) {
		body, port := getFrom(t, "127.0.0.3", sluice.String(), "")
		want := fmt.Sprintf("v2 pp=127.0.0.3:%d client=127.0.0.3 xff=127.0.0.3", port)
		if body != want {
			t.Fatalf("nginx answered %q, want %q", body, want)
		}
	})
	t.Run("balancer without header", func(t *testing.T) {
		body, _ := getFrom(t, "127.0.0.1", sluice.String(), "")
		if body != "" {
			t.Fatalf("a balancer's connection without a header was served: %q", body)
		}
	})
}

// getFromWith is getFrom, the request routed to sluice's v1 pool when v1.
func getFromWith(t *testing.T, src, addr, pre string, v1 bool) (string, int) {
	t.Helper()
	if !v1 {
		return getFrom(t, src, addr, pre)
	}
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(c, pre+"GET / HTTP/1.1\r\nHost: pp.test\r\nX-PP: v1\r\nConnection: close\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return "", c.LocalAddr().(*net.TCPAddr).Port
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return strings.TrimSpace(string(b)), c.LocalAddr().(*net.TCPAddr).Port
}
