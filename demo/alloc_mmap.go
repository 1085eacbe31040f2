//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package demo

import "syscall"

// mapMemory returns size bytes of private anonymous memory outside the Go
// heap. The kernel may refuse (too many mappings); the caller then falls
// back to the Go heap.
func mapMemory(size int) ([]byte, error) {
	return syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
}

// unmapMemory returns b, from mapMemory, to the operating system.
func unmapMemory(b []byte) {
	_ = syscall.Munmap(b)
}
