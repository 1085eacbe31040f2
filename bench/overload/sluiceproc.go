package main

// The sluice process under test: start, readiness, /status, goroutines,
// memory, and the free loopback ports it listens on.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// startSluice starts `sluice run` on free loopback ports with args (the
// backends), its data and log under cfg.Dir.
func startSluice(ctx context.Context, cfg config, backends []string) (*sluiceProc, error) {
	httpPort, err := freeTCPPort()
	if err != nil {
		return nil, err
	}
	adminPort, err := freeTCPPort()
	if err != nil {
		return nil, err
	}
	sipPort, err := freeUDPTCPPort()
	if err != nil {
		return nil, err
	}
	sl := &sluiceProc{
		admin: fmt.Sprintf("http://127.0.0.1:%d", adminPort),
		http:  fmt.Sprintf("http://127.0.0.1:%d", httpPort),
		sip:   fmt.Sprintf("127.0.0.1:%d", sipPort),
		done:  make(chan struct{}),
	}
	args := append(backends,
		"-http-listen", fmt.Sprintf("127.0.0.1:%d", httpPort),
		"-sip-listen", sl.sip,
		"-admin-listen", fmt.Sprintf("127.0.0.1:%d", adminPort),
		"-data-dir", filepath.Join(cfg.Dir, "data"),
		"-mop-max-heap", strconv.FormatFloat(cfg.MaxHeap, 'g', -1, 64),
		"-mop-window", cfg.Window.String(),
		"-mop-probe-interval", cfg.Probe.String(),
		"-mop-initial-rate", strconv.FormatFloat(cfg.InitialRate, 'g', -1, 64),
		"-mem-limit", "512MiB",
		"-log-level", "warn")
	logf, err := os.Create(filepath.Join(cfg.Dir, "sluice.log"))
	if err != nil {
		return nil, err
	}
	sl.cmd = exec.Command(cfg.Sluice, args...)
	sl.cmd.Stdout, sl.cmd.Stderr = logf, logf
	sl.cmd.SysProcAttr = childAttr()
	if err := sl.cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start %s: %w", cfg.Sluice, err)
	}
	go func() {
		sl.err = sl.cmd.Wait()
		logf.Close()
		close(sl.done)
	}()
	return sl, nil
}

// stop sends SIGTERM, waits up to grace for the drain, then kills. It
// reports whether the balancer stopped by itself.
func (sl *sluiceProc) stop(grace time.Duration) bool {
	select {
	case <-sl.done:
		return true
	default:
	}
	_ = sl.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-sl.done:
		return true
	case <-time.After(grace):
		_ = sl.cmd.Process.Kill()
		<-sl.done
		return false
	}
}

// waitUp waits until /status lists n backends, all up.
func (sl *sluiceProc) waitUp(ctx context.Context, n int, bound time.Duration) error {
	deadline := time.Now().Add(bound)
	var last string
	for time.Now().Before(deadline) {
		select {
		case <-sl.done:
			return fmt.Errorf("sluice exited at start (%v); see its log", sl.err)
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
		st, err := sl.status()
		if err == nil {
			up := 0
			for _, b := range st.Backends {
				if b.State == "up" {
					up++
				}
			}
			if up == n {
				return nil
			}
			last = fmt.Sprintf("%d of %d backends up", up, n)
		} else {
			last = err.Error()
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("sluice not ready within %v: %s", bound, last)
}

// statusDoc is the part of sluice's /status read here.
type statusDoc struct {
	Backends []struct {
		ID       string `json:"id"`
		Protocol string `json:"protocol"`
		State    string `json:"state"`
		MOP      struct {
			Phase       string  `json:"phase"`
			AllowedRate float64 `json:"allowed_rate"`
			LearnedRate float64 `json:"learned_rate"`
		} `json:"mop"`
	} `json:"backends"`
}

var adminClient = &http.Client{Timeout: 2 * time.Second}

func (sl *sluiceProc) status() (statusDoc, error) {
	var st statusDoc
	res, err := adminClient.Get(sl.admin + "/status")
	if err != nil {
		return st, err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return st, fmt.Errorf("/status: %s", res.Status)
	}
	return st, json.NewDecoder(res.Body).Decode(&st)
}

func (st statusDoc) learned() int {
	n := 0
	for _, b := range st.Backends {
		if b.MOP.Phase == "learned" {
			n++
		}
	}
	return n
}

func (st statusDoc) allowed(proto string) float64 {
	sum := 0.0
	for _, b := range st.Backends {
		if b.Protocol == proto {
			sum += b.MOP.AllowedRate
		}
	}
	return sum
}

// capacity is the learned rate of proto's backends summed; a backend
// still discovering counts with its allowed rate.
func (st statusDoc) capacity(proto string) float64 {
	sum := 0.0
	for _, b := range st.Backends {
		if b.Protocol != proto {
			continue
		}
		if b.MOP.LearnedRate > 0 {
			sum += b.MOP.LearnedRate
		} else {
			sum += b.MOP.AllowedRate
		}
	}
	return sum
}

// goroutines reads go_goroutines from the balancer's /metrics; 0 when it
// cannot.
func (sl *sluiceProc) goroutines() int {
	res, err := adminClient.Get(sl.admin + "/metrics")
	if err != nil {
		return 0
	}
	defer res.Body.Close()
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "go_goroutines "); ok {
			n, _ := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return int(n)
		}
	}
	return 0
}

// rss is a process's resident memory from /proc; 0 when unknown.
func rss(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(v)
			if len(f) > 0 {
				kb, _ := strconv.ParseInt(f[0], 10, 64)
				return kb << 10
			}
		}
	}
	return 0
}

func freeTCPPort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// freeUDPTCPPort is a loopback port free for both UDP and TCP (SIP
// listens on both).
func freeUDPTCPPort() (int, error) {
	for range 20 {
		u, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		port := u.LocalAddr().(*net.UDPAddr).Port
		t, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		u.Close()
		if err == nil {
			t.Close()
			return port, nil
		}
	}
	return 0, errors.New("no loopback port free for both UDP and TCP")
}

// lockedWriter serializes writes to w.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
