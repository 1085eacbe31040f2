package main

import (
	"fmt"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"
)

// sipTokenless is an in-dialog request of call n (sipInvite's) as a UA that
// ignores Record-Route sends it: to sluice, no Route header, so sluice
// finds the backend in its dialog table.
func sipTokenless(lb, from string, n, cseq int, method, branch string) string {
	return fmt.Sprintf("%s sip:svc@%s SIP/2.0\r\nVia: SIP/2.0/UDP %s;branch=z9hG4bK-%s;rport\r\nMax-Forwards: 70\r\nFrom: <sip:a@test>;tag=f%d\r\nTo: <sip:svc@test>;tag=uas\r\nCall-ID: fault-%d@test\r\nCSeq: %d %s\r\nContact: <sip:a@%s>\r\nContent-Length: 0\r\n\r\n",
		method, lb, from, branch, n, n, cseq, method, from)
}

// storeQueuePending is /status's storage.queue_pending (-1 when it cannot
// be read).
func storeQueuePending(t *testing.T, admin string) int {
	resp, err := http.Get("http://" + admin + "/status")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	var st struct {
		Storage *struct {
			QueuePending int `json:"queue_pending"`
		} `json:"storage"`
	}
	if decodeJSON(resp.Body, &st) != nil || st.Storage == nil {
		return -1
	}
	return st.Storage.QueuePending
}

// TestDialogsSurviveKill9: calls set up through sluice by a UA that
// ignores Record-Route, sluice killed with SIGKILL and started again on
// the same data directory: the re-INVITE, its ACK and the BYE of every
// call go to the backend that took its INVITE (round-robin, so the
// Call-ID hash a forgotten dialog falls back to is wrong for about half
// of them), and with -sip-unknown-dialog reject none is answered 481.
func TestDialogsSurviveKill9(t *testing.T) {
	if testing.Short() {
		t.Skip("runs sluice twice with a store process")
	}
	for _, unknown := range []string{"new-work", "reject"} {
		t.Run(unknown, func(t *testing.T) {
			const calls = 150
			s1, s2 := newSIPBackend(t, false), newSIPBackend(t, false)
			sipAddr, adminAddr := freePort(t), freePort(t)
			args := []string{"-http-listen", "off", "-sip-listen", sipAddr, "-admin-listen", adminAddr, "-data-dir", t.TempDir(),
				"-sip-backend", s1.addr + ",id=s1", "-sip-backend", s2.addr + ",id=s2", "-sip-lb-policy", "round-robin",
				"-sip-unknown-dialog", unknown, "-persist-interval", "100ms"}
			cmd, _ := startSluiceLog(t, args...)
			ua := newSIPClient(t, sipAddr)
			home := map[int]*sipBackend{}
			for n := range calls {
				if res := ua.roundTrip(t, sipInvite(sipAddr, ua.addr(), n)); !strings.HasPrefix(res, "SIP/2.0 200") {
					t.Fatalf("INVITE of call %d: %q", n, res)
				}
				ack := sipTokenless(sipAddr, ua.addr(), n, 1, "ACK", fmt.Sprintf("ack1-%d", n))
				if _, err := ua.c.WriteToUDP([]byte(ack), ua.dst); err != nil {
					t.Fatal(err)
				}
				callID := fmt.Sprintf("fault-%d@test", n)
				switch {
				case s1.got("INVITE", callID) == 1 && s2.got("INVITE", callID) == 0:
					home[n] = s1
				case s2.got("INVITE", callID) == 1 && s1.got("INVITE", callID) == 0:
					home[n] = s2
				default:
					t.Fatalf("INVITE of call %d reached s1 %d and s2 %d times", n, s1.got("INVITE", callID), s2.got("INVITE", callID))
				}
			}
			on1 := 0
			for _, b := range home {
				if b == s1 {
					on1++
				}
			}
			if on1 == 0 || on1 == calls {
				t.Fatalf("%d of %d calls on s1: round-robin should spread them", on1, calls)
			}
			// The dialogs reach the store within a batch (100 ms) and a
			// write: wait until the store's queue has been empty twice,
			// a batch apart.
			waitFor(t, 10*time.Second, "dialogs written to the store", func() bool {
				if storeQueuePending(t, adminAddr) != 0 {
					return false
				}
				time.Sleep(300 * time.Millisecond)
				return storeQueuePending(t, adminAddr) == 0
			})
			if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			cmd.Wait()
			_, lines := startSluiceLog(t, args...)
			restored := ""
			for _, l := range lines {
				if strings.Contains(l, `msg="sip dialogs restored"`) {
					restored = l
				}
			}
			if !strings.Contains(restored, fmt.Sprintf("restored=%d", calls)) {
				t.Errorf("want %d dialogs restored before the listener opened; log:\n%s", calls, strings.Join(lines, "\n"))
			}

			wrong, rejected := 0, 0
			for n := range calls {
				failed := false
				callID := fmt.Sprintf("fault-%d@test", n)
				other := s1
				if home[n] == s1 {
					other = s2
				}
				re := ua.exchange(sipTokenless(sipAddr, ua.addr(), n, 2, "INVITE", fmt.Sprintf("re-%d", n)), 5*time.Second)
				ack := sipTokenless(sipAddr, ua.addr(), n, 2, "ACK", fmt.Sprintf("ack2-%d", n))
				if _, err := ua.c.WriteToUDP([]byte(ack), ua.dst); err != nil {
					t.Fatal(err)
				}
				bye := ua.exchange(sipTokenless(sipAddr, ua.addr(), n, 3, "BYE", fmt.Sprintf("bye-%d", n)), 5*time.Second)
				for _, res := range []string{re, bye} {
					if strings.HasPrefix(res, "SIP/2.0 481") {
						rejected++
					} else if !strings.HasPrefix(res, "SIP/2.0 200") {
						t.Errorf("call %d after the restart: %q", n, res)
						failed = true
					}
				}
				// The ACK has no answer: wait until a backend has it (a
				// dropped one shows as a count below).
				for end := time.Now().Add(2 * time.Second); home[n].got("ACK", callID)+other.got("ACK", callID) < 2 && time.Now().Before(end); {
					time.Sleep(time.Millisecond)
				}
				if home[n].got("INVITE", callID) != 2 || home[n].got("BYE", callID) != 1 || home[n].got("ACK", callID) != 2 ||
					other.got("INVITE", callID)+other.got("BYE", callID)+other.got("ACK", callID) != 0 || failed {
					wrong++
					t.Logf("call %d: INVITE/ACK/BYE at its backend %d/%d/%d, at the other %d/%d/%d", n,
						home[n].got("INVITE", callID), home[n].got("ACK", callID), home[n].got("BYE", callID),
						other.got("INVITE", callID), other.got("ACK", callID), other.got("BYE", callID))
				}
				if wrong+rejected > 10 {
					t.Fatalf("after kill -9 and restart: %d of the first %d calls failed or at the wrong backend, %d requests answered 481; giving up", wrong, n+1, rejected)
				}
			}
			if wrong != 0 || rejected != 0 {
				t.Errorf("after kill -9 and restart: %d of %d calls failed or had in-dialog requests at the wrong backend, %d requests answered 481", wrong, calls, rejected)
			}
		})
	}
}
