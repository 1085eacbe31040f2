package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluicelb/sluice/internal/testenv"
)

// sippMsg is one message of a SIPp -trace_msg file.
type sippMsg struct {
	at       time.Time
	received bool
	status   int    // 0: a request
	method   string // the request's, or the CSeq method of a response
	callID   string
}

// parseSIPpTrace reads a SIPp -trace_msg file: blocks that start with a
// line of dashes and the time, then "UDP message sent|received", a blank
// line and the message.
func parseSIPpTrace(b []byte) []sippMsg {
	var out []sippMsg
	for _, blk := range strings.Split(string(b), "----------------------------------------------- ")[1:] {
		lines := strings.Split(strings.ReplaceAll(blk, "\r\n", "\n"), "\n")
		if len(lines) < 4 {
			continue
		}
		at, _ := time.ParseInLocation("2006-01-02 15:04:05.000000", strings.TrimSpace(lines[0]), time.Local)
		m := sippMsg{at: at, received: strings.Contains(lines[1], "received")}
		first := strings.TrimSpace(lines[3])
		if rest, ok := strings.CutPrefix(first, "SIP/2.0 "); ok {
			m.status, _ = strconv.Atoi(strings.Fields(rest)[0])
		} else if f := strings.Fields(first); len(f) > 0 {
			m.method = f[0]
		}
		for _, l := range lines[4:] {
			if l == "" {
				break
			}
			name, v, ok := strings.Cut(l, ":")
			if !ok {
				continue
			}
			switch strings.ToLower(strings.TrimSpace(name)) {
			case "call-id", "i":
				m.callID = strings.TrimSpace(v)
			case "cseq":
				if f := strings.Fields(v); len(f) == 2 && m.status != 0 {
					m.method = f[1]
				}
			}
		}
		out = append(out, m)
	}
	return out
}

// freeUDP returns a loopback UDP port nobody listens on right now.
func freeUDP(t *testing.T) int {
	t.Helper()
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).Port
}

// startSIPp starts sipp with args in dir and stops it by its PID when the
// test ends; done is closed when it exits.
func startSIPp(t *testing.T, sipp, dir string, args ...string) (cmd *exec.Cmd, done chan struct{}, out *bytes.Buffer) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	cmd = exec.CommandContext(ctx, sipp, args...)
	cmd.Dir = dir
	out = &bytes.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatal(err)
	}
	done = make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-done
		cancel()
	})
	return cmd, done, out
}

// TestSIPpDialogsSurviveKill9 is the kill -9 promise with real SIPp: the
// built-in uac scenario (it ignores Record-Route: its ACK and BYE go to
// sluice's address without Route, so only the dialog table, keyed by
// Call-ID and From-tag, finds their backend) places calls of 3 s through
// sluice to two SIPp answerers taken round-robin; sluice is killed with
// SIGKILL in the middle of the load and started again on the same data
// directory. Every call whose 200 the client received must end with its
// BYE answered 200 by the answerer that answered its INVITE, none at the
// other, and no 481 (with -sip-unknown-dialog reject, a dialog sluice
// forgot is answered 481). Bounded: 240 calls at 40/s, sipp under 90 s.
func TestSIPpDialogsSurviveKill9(t *testing.T) {
	if testing.Short() {
		t.Skip("runs sluice twice and sipp")
	}
	sipp := testenv.Tool(t, "sipp", "sip-tester")
	for _, unknown := range []string{"new-work", "reject"} {
		t.Run(unknown, func(t *testing.T) {
			dir := t.TempDir()
			p1, p2 := freeUDP(t), freeUDP(t)
			for p2 == p1 {
				p2 = freeUDP(t)
			}
			for _, p := range []int{p1, p2} {
				_, done, out := startSIPp(t, sipp, dir, "-sn", "uas", "-i", "127.0.0.1", "-p", strconv.Itoa(p), "-nostdin",
					"-trace_msg", "-message_file", filepath.Join(dir, fmt.Sprintf("uas%d.msg", p)))
				waitFor(t, 10*time.Second, "sipp uas listening", func() bool {
					select {
					case <-done:
						t.Fatalf("sipp uas on %d exited: %s", p, out.String())
					default:
					}
					// The kernel's socket table: a bind of our own could
					// make sipp's fail.
					return testenv.Bound(t, "udp", p)
				})
			}
			sipAddr, adminAddr := freePort(t), freePort(t)
			args := []string{"-http-listen", "off", "-sip-listen", sipAddr, "-admin-listen", adminAddr, "-data-dir", filepath.Join(dir, "data"),
				"-sip-backend", fmt.Sprintf("127.0.0.1:%d,id=s1", p1), "-sip-backend", fmt.Sprintf("127.0.0.1:%d,id=s2", p2),
				"-sip-lb-policy", "round-robin", "-sip-unknown-dialog", unknown, "-persist-interval", "100ms"}
			sl, _ := startSluiceLog(t, args...)

			const calls, rate = 240, 40
			uacMsgs := filepath.Join(dir, "uac.msg")
			_, uacDone, uacOut := startSIPp(t, sipp, dir, sipAddr, "-sn", "uac", "-i", "127.0.0.1", "-p", strconv.Itoa(freeUDP(t)),
				"-r", strconv.Itoa(rate), "-m", strconv.Itoa(calls), "-d", "3000", "-nostdin", "-timeout", "90s",
				"-recv_timeout", "30000", "-trace_msg", "-message_file", uacMsgs)
			// Kill once 60 calls are established: some have ended, most
			// are in their 3 s, more are being set up.
			waitFor(t, 30*time.Second, "60 calls established", func() bool {
				b, _ := os.ReadFile(uacMsgs)
				n := 0
				for _, m := range parseSIPpTrace(b) {
					if m.received && m.status == 200 && m.method == "INVITE" {
						n++
					}
				}
				return n >= 60
			})
			if err := sl.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			sl.Wait()
			killed := time.Now()
			_, lines := startSluiceLog(t, args...)
			restarted := time.Now()
			for _, l := range lines {
				if strings.Contains(l, "dialogs restored") || strings.Contains(l, "store process") {
					t.Log(l)
				}
			}
			select {
			case <-uacDone:
			case <-time.After(90 * time.Second):
				t.Fatalf("sipp uac still running after 90 s: %s", tail(uacOut.String(), 2000))
			}

			// Who answered what.
			type callState struct {
				ok200, bye200, got481 bool
				ok200At               time.Time
			}
			uac := map[string]*callState{}
			b, _ := os.ReadFile(uacMsgs)
			for _, m := range parseSIPpTrace(b) {
				if !m.received || m.status == 0 {
					continue
				}
				c := uac[m.callID]
				if c == nil {
					c = &callState{}
					uac[m.callID] = c
				}
				switch {
				case m.status == 200 && m.method == "INVITE" && !c.ok200:
					c.ok200, c.ok200At = true, m.at
				case m.status == 200 && m.method == "BYE":
					c.bye200 = true
				case m.status == 481:
					c.got481 = true
				}
			}
			type seen struct{ invite, bye bool }
			at := [2]map[string]*seen{{}, {}}
			for i, p := range []int{p1, p2} {
				b, _ := os.ReadFile(filepath.Join(dir, fmt.Sprintf("uas%d.msg", p)))
				for _, m := range parseSIPpTrace(b) {
					if !m.received || m.status != 0 {
						continue
					}
					s := at[i][m.callID]
					if s == nil {
						s = &seen{}
						at[i][m.callID] = s
					}
					switch m.method {
					case "INVITE":
						s.invite = true
					case "BYE":
						s.bye = true
					}
				}
			}
			established, straddling, wrong, unanswered, rejected := 0, [2]int{}, 0, 0, 0
			for id, c := range uac {
				if !c.ok200 {
					continue
				}
				established++
				a, b := at[0][id], at[1][id]
				byeAt := -1
				switch {
				case a != nil && a.bye && (b == nil || !b.bye):
					byeAt = 0
				case b != nil && b.bye && (a == nil || !a.bye):
					byeAt = 1
				}
				home := at[max(byeAt, 0)][id]
				switch {
				case c.got481:
					rejected++
					t.Logf("call %s: 481", id)
				case !c.bye200:
					unanswered++
					t.Logf("call %s: BYE not answered 200", id)
				case byeAt < 0 || !home.invite:
					wrong++
					t.Logf("call %s: BYE at an answerer that did not take its INVITE (or at both)", id)
				}
				if c.ok200At.Before(killed) && byeAt >= 0 {
					straddling[byeAt]++
				}
			}
			t.Logf("%d calls established (%d before the kill, at s1 %d, s2 %d); sluice down %v; %d BYEs at the wrong answerer, %d unanswered, %d calls with a 481",
				established, straddling[0]+straddling[1], straddling[0], straddling[1], restarted.Sub(killed).Round(time.Millisecond), wrong, unanswered, rejected)
			if wrong+unanswered+rejected != 0 {
				t.Errorf("after kill -9 and restart: %d calls had their BYE at the wrong answerer, %d had it unanswered, %d got a 481; want 0\n%s",
					wrong, unanswered, rejected, tail(uacOut.String(), 2000))
			}
			if straddling[0] < 10 || straddling[1] < 10 {
				t.Errorf("%d and %d calls established at s1 and s2 before the kill: too few to test anything", straddling[0], straddling[1])
			}
		})
	}
}
