//go:build !linux

package tlsedge

// threadCPU is unknown off Linux: the benchmarks report no server CPU.
func threadCPU() int64 { return -1 }
