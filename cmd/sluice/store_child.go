package main

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"syscall"

	"github.com/sluicelb/sluice/persist"
)

// storeChildName is the hidden subcommand that runs the store process:
// the Badger database of -data-dir lives in this child of `sluice run`,
// so that a fault of the disk that kills Badger's process (SIGBUS on a
// full filesystem: its files are written through memory mappings) never
// kills the balancer. It is not listed in the help: only sluice starts it.
const storeChildName = "store-child"

// runStoreChild serves the store on fd 3 (a socketpair end the balancer
// hands over) and commits the dialog journal of fd 4 until the balancer
// closes them or dies.
func runStoreChild(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet(storeChildName, flag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := fs.String("dir", "", "data directory (started by sluice run; not for direct use)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *dir == "" {
		fmt.Fprintln(stderr, "sluice store-child: -dir is required: the data directory")
		return 2
	}
	// A signal to the whole process group (systemd's stop with its
	// default KillMode=control-group, Ctrl-C in a terminal, a hang-up)
	// reaches this process as well as the balancer: it must not end the
	// store while the balancer drains and makes its final save. The
	// balancer ends it by closing the socket, or by dying (parent-death
	// signal).
	signal.Ignore(syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	setProcessName("sluice-store")
	yieldOnWake()
	conn := os.NewFile(3, "store-socket")
	if _, err := conn.Stat(); err != nil {
		fmt.Fprintf(stderr, "sluice store-child: fd 3 is not open (%v): this command is started by sluice run\n", err)
		return 2
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn})).
		With("component", "store-process", "pid", os.Getpid())
	journal := os.NewFile(4, "store-journal")
	if _, err := journal.Stat(); err != nil {
		journal = nil
	}
	if err := persist.RunChild(*dir, conn, journal, log); err != nil {
		log.Error("store process failed", "dir", *dir, "err", err)
		return 1
	}
	return 0
}

// storeChildCommand runs this binary as the store process of dir; it is
// persist.Config.Child for `sluice run`. SLUICE_TEST_MAIN makes a test
// binary of this package dispatch to the subcommand like sluice does.
//
// On Linux it runs /proc/self/exe: the very binary of the running sluice,
// even when an upgrade has replaced the file, so that the store process
// always speaks the balancer's version of the protocol.
func storeChildCommand(dir string) *exec.Cmd {
	exe := "/proc/self/exe"
	if _, err := os.Stat(exe); err != nil {
		if exe, err = os.Executable(); err != nil {
			exe = os.Args[0]
		}
	}
	cmd := exec.Command(exe, storeChildName, "-dir", dir)
	// ps shows "sluice store-child -dir DIR", not the /proc/self/exe it
	// was started by (the process's name is set in runStoreChild).
	cmd.Args[0] = "sluice"
	cmd.Env = append(os.Environ(), "SLUICE_TEST_MAIN=1")
	cmd.Stderr = os.Stderr
	return cmd
}
