//go:build !linux

package main

// setProcessName does nothing outside Linux.
func setProcessName(string) {}
