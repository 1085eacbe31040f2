//go:build !linux

package main

// setProcessName does nothing outside Linux.
func setProcessName(string) {}

// yieldOnWake does nothing outside Linux.
func yieldOnWake() int { return 0 }
