package demo

import "os"

var pageSize = os.Getpagesize()

// block is one held allocation.
type block struct {
	b      []byte
	mapped bool // from mapMemory; free with unmapMemory
}

// allocBlock returns size bytes of resident memory: from an anonymous
// mapping unless goHeap is set or mapping fails, else from the Go heap.
func allocBlock(size int, goHeap bool) block {
	if size == 0 {
		return block{}
	}
	var blk block
	if !goHeap {
		if b, err := mapMemory(size); err == nil {
			blk = block{b: b, mapped: true}
		}
	}
	if blk.b == nil {
		blk.b = make([]byte, size)
	}
	touch(blk.b)
	return blk
}

// touch writes one byte per page so that every page is backed by real
// memory. Fresh pages, from a mapping or from a large Go allocation, are
// only reserved until first written.
func touch(b []byte) {
	for i := 0; i < len(b); i += pageSize {
		b[i] = 1
	}
	b[len(b)-1] = 1
}

// free gives the memory back: at once for a mapping, at the next garbage
// collection for the Go heap.
func (blk block) free() {
	if blk.mapped {
		unmapMemory(blk.b)
	}
}
