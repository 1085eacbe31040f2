package admission

import (
	"bufio"
	"bytes"
	"io/fs"
	"math"
	"path"
	"strconv"
	"strings"
)

// Where the memory limit of the node memory states comes from
// (MemoryConfig.LimitSource, shown in /status).
const (
	LimitFromConfig     = "configured"
	LimitFromCgroupV2   = "cgroup v2 memory.max"
	LimitFromCgroupV1   = "cgroup v1 memory.limit_in_bytes"
	LimitFromGOMEMLIMIT = "GOMEMLIMIT"
	LimitFromNone       = "none"
)

// cgroupUnlimited is the least cgroup v1 limit read as "no limit": v1
// reports an unlimited group as the largest page-aligned int64.
const cgroupUnlimited = 1 << 62

// DetectLimit finds the memory limit when -mem-limit is not given. Inside
// a container the OOM killer counts the cgroup, so the cgroup's limit
// counts: v2 memory.max, else v1 memory.limit_in_bytes, the smallest along
// the process's cgroup path up to the root. gomemlimit is the Go runtime's
// limit (debug.SetMemoryLimit(-1); math.MaxInt64 or less than 1 for
// none). The smaller of the two wins; without either the limit is 0 and
// the source LimitFromNone. root is the file system holding /proc and
// /sys (os.DirFS("/") outside tests); files it lacks mean no cgroup limit.
func DetectLimit(root fs.FS, gomemlimit int64) (limit int64, source string) {
	limit, source = 0, LimitFromNone
	if gomemlimit > 0 && gomemlimit < math.MaxInt64 {
		limit, source = gomemlimit, LimitFromGOMEMLIMIT
	}
	if l, src := cgroupLimit(root); l > 0 && (limit == 0 || l < limit) {
		limit, source = l, src
	}
	return limit, source
}

// cgroupLimit reads the cgroup memory limit of this process, 0 for none.
func cgroupLimit(root fs.FS) (int64, string) {
	data, err := fs.ReadFile(root, "proc/self/cgroup")
	if err != nil {
		return 0, ""
	}
	var v2Path, v1Path string
	v1 := false
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		// hierarchy-ID:controller-list:cgroup-path
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[0] == "0" && parts[1] == "" {
			v2Path = parts[2]
		}
		for _, c := range strings.Split(parts[1], ",") {
			if c == "memory" {
				v1, v1Path = true, parts[2]
			}
		}
	}
	if v2Path != "" {
		if l := smallestUp(root, "sys/fs/cgroup", v2Path, "memory.max"); l > 0 {
			return l, LimitFromCgroupV2
		}
	}
	if v1 {
		if l := smallestUp(root, "sys/fs/cgroup/memory", v1Path, "memory.limit_in_bytes"); l > 0 {
			return l, LimitFromCgroupV1
		}
	}
	return 0, ""
}

// smallestUp is the smallest limit in file along cgroup path p under
// mount, from p up to the mount's root. A container often sees its own
// cgroup mounted as the root while /proc/self/cgroup names the host's
// path: directories that do not exist are skipped.
func smallestUp(root fs.FS, mount, p, file string) int64 {
	var best int64
	p = path.Clean("/" + p)
	for {
		if l := readLimit(root, path.Join(mount, p, file)); l > 0 && (best == 0 || l < best) {
			best = l
		}
		if p == "/" {
			return best
		}
		p = path.Dir(p)
	}
}

// readLimit reads one limit file: bytes, or "max" (v2) or a value of at
// least cgroupUnlimited (v1) for none (0).
func readLimit(root fs.FS, name string) int64 {
	data, err := fs.ReadFile(root, strings.TrimPrefix(name, "/"))
	if err != nil {
		return 0
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
	if err != nil || n <= 0 || n >= cgroupUnlimited {
		return 0
	}
	return n
}
