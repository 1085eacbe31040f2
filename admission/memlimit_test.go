package admission

import (
	"math"
	"testing"
	"testing/fstest"
)

func TestDetectLimit(t *testing.T) {
	file := func(s string) *fstest.MapFile { return &fstest.MapFile{Data: []byte(s)} }
	const gib = 1 << 30
	tests := []struct {
		name       string
		fs         fstest.MapFS
		gomemlimit int64
		want       int64
		wantSource string
	}{
		{"nothing", fstest.MapFS{}, math.MaxInt64, 0, LimitFromNone},
		{"GOMEMLIMIT only", fstest.MapFS{}, 2 * gib, 2 * gib, LimitFromGOMEMLIMIT},
		{"v2 container root", fstest.MapFS{
			"proc/self/cgroup":         file("0::/\n"),
			"sys/fs/cgroup/memory.max": file("1073741824\n"),
		}, math.MaxInt64, gib, LimitFromCgroupV2},
		{"v2 max is no limit", fstest.MapFS{
			"proc/self/cgroup":         file("0::/\n"),
			"sys/fs/cgroup/memory.max": file("max\n"),
		}, math.MaxInt64, 0, LimitFromNone},
		{"v2 nested: the smallest on the way up", fstest.MapFS{
			"proc/self/cgroup": file("0::/system.slice/sluice.service\n"),
			"sys/fs/cgroup/system.slice/sluice.service/memory.max": file("max\n"),
			"sys/fs/cgroup/system.slice/memory.max":                file("536870912\n"),
		}, math.MaxInt64, gib / 2, LimitFromCgroupV2},
		{"v2 host path not mounted in the container", fstest.MapFS{
			"proc/self/cgroup":         file("0::/kubepods/pod1/c1\n"),
			"sys/fs/cgroup/memory.max": file("268435456\n"),
		}, math.MaxInt64, gib / 4, LimitFromCgroupV2},
		{"v1", fstest.MapFS{
			"proc/self/cgroup": file("12:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n"),
			"sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes": file("805306368\n"),
		}, math.MaxInt64, 768 << 20, LimitFromCgroupV1},
		{"v1 unlimited", fstest.MapFS{
			"proc/self/cgroup":                           file("4:memory:/\n"),
			"sys/fs/cgroup/memory/memory.limit_in_bytes": file("9223372036854771712\n"),
		}, math.MaxInt64, 0, LimitFromNone},
		{"GOMEMLIMIT below the cgroup wins", fstest.MapFS{
			"proc/self/cgroup":         file("0::/\n"),
			"sys/fs/cgroup/memory.max": file("1073741824\n"),
		}, gib / 2, gib / 2, LimitFromGOMEMLIMIT},
		{"cgroup below GOMEMLIMIT wins", fstest.MapFS{
			"proc/self/cgroup":         file("0::/\n"),
			"sys/fs/cgroup/memory.max": file("1073741824\n"),
		}, 4 * gib, gib, LimitFromCgroupV2},
		{"garbage is no limit", fstest.MapFS{
			"proc/self/cgroup":         file("0::/\n"),
			"sys/fs/cgroup/memory.max": file("lots\n"),
		}, math.MaxInt64, 0, LimitFromNone},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, src := DetectLimit(tc.fs, tc.gomemlimit)
			if got != tc.want || src != tc.wantSource {
				t.Errorf("DetectLimit = %d, %q; want %d, %q", got, src, tc.want, tc.wantSource)
			}
		})
	}
}
