package persist

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"unsafe"
)

// parentDeathSignal is what the kernel sends the store process when the
// balancer dies (PR_SET_PDEATHSIG). Not SIGKILL: the balancer may have
// relayed a call's 2xx right after handing its dialog record to the
// journal socket, so the store process first reads and commits what the
// balancer sent (childDrainTimeout at most), then exits. SIGUSR2 is sent
// by nothing else sluice runs alongside (process-group signals are
// SIGTERM, SIGINT, SIGHUP).
var parentDeathSignal os.Signal = syscall.SIGUSR2

// setParentDeath has the kernel signal the store process when the
// balancer dies, so that no store process outlives it holding the data
// directory; the child also exits on EOF of its sockets.
func setParentDeath(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGUSR2
}

func socketpair() ([2]int, error) {
	return syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
}

// journalPair is the journal's socketpair: SOCK_SEQPACKET, so that a
// send queues a whole message or nothing (EAGAIN), never part of one.
// The balancer's end gets a send buffer of journalSndBuf (the kernel caps
// it at net.core.wmem_max).
func journalPair() ([2]int, error) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_SEQPACKET|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return fds, err
	}
	_ = syscall.SetsockoptInt(fds[0], syscall.SOL_SOCKET, syscall.SO_SNDBUF, journalSndBuf)
	return fds, nil
}

// sendJournal queues msg on the journal socket without waiting: EAGAIN
// when the socket's buffer cannot take it, EPIPE when the store process
// is gone (no SIGPIPE).
func sendJournal(fd int, msg []byte) error {
	if len(msg) == 0 {
		return nil
	}
	for {
		// A raw call: MSG_DONTWAIT never lets it block, so the runtime's
		// bookkeeping around a blocking call, which wakes its monitor
		// thread for the next millisecond, is not needed (sip's raw UDP
		// sends say more).
		_, _, e := syscall.RawSyscall6(syscall.SYS_SENDTO, uintptr(fd), uintptr(unsafe.Pointer(unsafe.SliceData(msg))), uintptr(len(msg)),
			syscall.MSG_DONTWAIT|syscall.MSG_NOSIGNAL, 0, 0)
		switch e {
		case 0:
			return nil
		case syscall.EINTR:
			continue
		}
		return e
	}
}

func closeFD(fd int) { syscall.Close(fd) }

// readFD reads one message of a non-blocking socket: n == 0 at its end,
// again true when none is queued. It is a raw system call, as the
// balancer's send is: the socket never blocks, and syscall.Read's
// passage through the scheduler's system-call path woke the runtime's
// monitor thread to poll every 20 µs after each journal message (a
// quarter of the store process's CPU under a SIP call load, perf).
func readFD(fd int, p []byte) (n int, again bool, err error) {
	if len(p) == 0 {
		return 0, false, syscall.EINVAL
	}
	for {
		r, _, e := syscall.RawSyscall(syscall.SYS_READ, uintptr(fd), uintptr(unsafe.Pointer(unsafe.SliceData(p))), uintptr(len(p)))
		switch e {
		case 0:
			return int(r), false, nil
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			return 0, true, nil
		}
		return 0, false, e
	}
}

// pollable returns f as a non-blocking file read through the runtime's
// poller (an inherited descriptor is blocking); f is closed.
func pollable(f *os.File) (*os.File, error) {
	fd, err := syscall.Dup(int(f.Fd()))
	f.Close()
	if err != nil {
		return nil, err
	}
	syscall.CloseOnExec(fd)
	if err := syscall.SetNonblock(fd, true); err != nil {
		syscall.Close(fd)
		return nil, err
	}
	return os.NewFile(uintptr(fd), f.Name()), nil
}

// orphanStoreProcess returns the PID written in the Badger lock file of
// db when that process runs this same binary (/proc/PID/exe) and is not
// this process: a store process left by a balancer that died, still
// holding the database (stuck, or stopped: it ignores its parent-death
// signal until it runs again). 0 when there is none.
func orphanStoreProcess(db string) int {
	f, err := os.Open(filepath.Join(db, "LOCK"))
	if err != nil {
		return 0
	}
	defer f.Close()
	var b [32]byte
	n, _ := f.Read(b[:])
	pid, err := strconv.Atoi(strings.TrimSpace(string(b[:n])))
	if err != nil || pid <= 1 || pid == os.Getpid() || pid == os.Getppid() {
		return 0
	}
	them, err := os.Stat("/proc/" + strconv.Itoa(pid) + "/exe")
	if err != nil {
		return 0
	}
	us, err := os.Stat("/proc/self/exe")
	if err != nil || !os.SameFile(them, us) {
		return 0
	}
	return pid
}

func killPID(pid int) error { return syscall.Kill(pid, syscall.SIGKILL) }
