//go:build race

package accesslog

// raceOn: the race detector allocates on its own; allocation counts are checked without it.
const raceOn = true
