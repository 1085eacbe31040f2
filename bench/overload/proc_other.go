//go:build !linux

package main

import "syscall"

// childAttr: no parent-death signal outside Linux; the driver stops the
// balancer itself.
func childAttr() *syscall.SysProcAttr { return nil }
