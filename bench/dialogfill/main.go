// Command dialogfill writes live SIP dialog records into a sluice data
// directory before sluice starts, so that it restores them into its dialog
// table (RestoreDialogs) and a load can be measured with that many live
// dialogs in the table and in the store, without setting each of them up
// with a call first (a million calls through SIPp would take several
// minutes and gigabytes of SIPp state).
//
//	dialogfill -sluice ./sluice -dir /tmp/data -n 1000000 -backend 127.0.0.1:15071 -backend 127.0.0.1:15072
//
// It opens the directory as sluice does (format 3: the store process is
// `SLUICE store-child`), writes n records with random keys, a To-tag, the
// backends in turn and an expiry -ttl ahead, in batches paced on the
// store's queue so that none is dropped, closes the store (every record
// committed), opens it again and counts the live records: it exits 1 unless
// exactly n are there. The keys are random 64-bit values, so no real
// call's request matches one: they are other callers' dialogs, as in a
// production table.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/sluicelb/sluice/persist"
)

type backends []string

func (b *backends) String() string     { return fmt.Sprint(*b) }
func (b *backends) Set(v string) error { *b = append(*b, v); return nil }

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "dialogfill:", err)
		os.Exit(1)
	}
}

func run() error {
	bin := flag.String("sluice", "", "the sluice binary whose store process writes the records (required)")
	dir := flag.String("dir", "", "the data directory, as sluice's -data-dir (required)")
	n := flag.Int("n", 0, "how many dialogs to write")
	ttl := flag.Duration("ttl", 2*time.Hour, "each dialog's expiry, from now")
	batch := flag.Int("batch", 4096, "records per batch handed to the store")
	var bes backends
	flag.Var(&bes, "backend", "a SIP backend id (sluice's -sip-backend address); repeat for more, used in turn (required)")
	flag.Parse()
	switch {
	case *bin == "" || *dir == "":
		return errors.New("-sluice and -dir are required")
	case len(bes) == 0:
		return errors.New("-backend is required (the id of a backend the sluice run will have)")
	case *n < 0 || *batch <= 0:
		return fmt.Errorf("-n %d -batch %d: want n >= 0 and batch > 0", *n, *batch)
	case *ttl <= time.Minute:
		return fmt.Errorf("-ttl %v: want more than a minute, so the dialogs outlive the run", *ttl)
	}
	abs, err := filepath.Abs(*bin)
	if err != nil {
		return err
	}
	child := func(d string) *exec.Cmd {
		cmd := exec.Command(abs, "store-child", "-dir", d)
		cmd.Stderr = os.Stderr
		return cmd
	}
	cfg := persist.Config{Dir: *dir, Child: child, QueueMax: 4 * *batch, ChildCallTimeout: time.Minute}
	st, err := persist.Open(cfg, nil)
	if err != nil {
		return err
	}
	expires := time.Now().Add(*ttl)
	recs := make([]persist.DialogRecord, 0, *batch)
	start := time.Now()
	for i := 0; i < *n; {
		recs = recs[:0]
		for ; i < *n && len(recs) < *batch; i++ {
			k := rand.Uint64() | 1
			recs = append(recs, persist.DialogRecord{Key: k, Backend: bes[i%len(bes)], ToTag: uint32(k>>32) | 1, Expires: expires})
		}
		st.PutDialogs(recs)
		// Pace on the queue: at most two batches waiting for the store
		// process, so none is dropped (QueueMax is four).
		for st.Health().QueuePending > 2**batch {
			time.Sleep(time.Millisecond)
		}
	}
	h := st.Health()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := st.Close(ctx); err != nil {
		return fmt.Errorf("close: %w", err)
	}
	if h.QueueDropped > 0 {
		return fmt.Errorf("%d records dropped before the store process took them", h.QueueDropped)
	}
	wrote := time.Since(start)

	t0 := time.Now()
	st, err = persist.Open(cfg, nil)
	if err != nil {
		return fmt.Errorf("reopen: %w", err)
	}
	t1 := time.Now()
	got, lerr := st.LoadDialogs(time.Now(), 0)
	loaded := time.Since(t1)
	if err := st.Close(ctx); err != nil {
		return fmt.Errorf("close after load: %w", err)
	}
	if lerr != nil {
		return lerr
	}
	fmt.Printf("wrote %d dialogs in %.1fs, %d live in %s; reopened in %.2fs and read back in %.2fs\n",
		*n, wrote.Seconds(), len(got), *dir, t1.Sub(t0).Seconds(), loaded.Seconds())
	if len(got) != *n {
		return fmt.Errorf("%d live dialogs after the write, want %d", len(got), *n)
	}
	return nil
}
