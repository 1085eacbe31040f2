package main

import (
	"net/http"
	"slices"
	"syscall"
	"testing"
	"time"
)

// historyTimes is the "t" column of GET /status/history?resolution=res.
func historyTimes(t *testing.T, admin, res string) []float64 {
	t.Helper()
	resp, err := http.Get("http://" + admin + "/status/history?resolution=" + res)
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	var doc struct {
		T        []float64 `json:"t"`
		Interval float64   `json:"interval_seconds"`
	}
	if err := decodeJSON(resp.Body, &doc); err != nil || resp.StatusCode != 200 {
		t.Fatalf("/status/history?resolution=%s: %d %v", res, resp.StatusCode, err)
	}
	return doc.T
}

// TestHistorySurvivesKill9: the dashboard's samples (1 s and 10 s) recorded
// before sluice is killed with SIGKILL are in /status/history of the
// sluice started again on the same data directory, before and under the
// new ones.
func TestHistorySurvivesKill9(t *testing.T) {
	if testing.Short() {
		t.Skip("runs sluice twice with a store process")
	}
	s1 := newSIPBackend(t, false)
	sipAddr, adminAddr := freePort(t), freePort(t)
	args := []string{"-http-listen", "off", "-sip-listen", sipAddr, "-admin-listen", adminAddr, "-data-dir", t.TempDir(),
		"-sip-backend", s1.addr + ",id=s1", "-persist-interval", "100ms"}
	cmd, _ := startSluiceLog(t, args...)
	var fine, coarse []float64
	waitFor(t, 20*time.Second, "3 samples of 1 s and one of 10 s", func() bool {
		fine, coarse = historyTimes(t, adminAddr, "1s"), historyTimes(t, adminAddr, "10s")
		return len(fine) >= 3 && len(coarse) >= 1
	})
	waitFor(t, 10*time.Second, "the samples written to the store", func() bool {
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
	startSluiceLog(t, args...)
	fine2, coarse2 := historyTimes(t, adminAddr, "1s"), historyTimes(t, adminAddr, "10s")
	for _, c := range []struct {
		res           string
		before, after []float64
	}{{"1s", fine, fine2}, {"10s", coarse, coarse2}} {
		for _, ts := range c.before {
			if !slices.Contains(c.after, ts) {
				t.Errorf("resolution %s: the sample at %.3f before the kill is not in the history after the restart: %v", c.res, ts, c.after)
			}
		}
		if !slices.IsSorted(c.after) {
			t.Errorf("resolution %s: history after the restart not in time order: %v", c.res, c.after)
		}
	}
}
