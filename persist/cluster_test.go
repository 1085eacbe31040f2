package persist

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// TestClusterNodesSurviveReopen: the cluster's last node count is read
// back after a restart, a corrupt file is reported, and -data-reset knows
// the file.
func TestClusterNodesSurviveReopen(t *testing.T) {
	dir := t.TempDir()
	s := openTest(t, Config{Dir: dir})
	if got := s.ClusterNodes(); got != 0 {
		t.Fatalf("fresh store: %d nodes, want 0", got)
	}
	if err := s.SetClusterNodes(0); err == nil {
		t.Error("a count of 0 was accepted")
	}
	if err := s.SetClusterNodes(3); err != nil {
		t.Fatal(err)
	}
	s.Close(bg)
	s2 := openTest(t, Config{Dir: dir})
	if got := s2.ClusterNodes(); got != 3 {
		t.Fatalf("after reopen: %d nodes, want 3", got)
	}
	s2.Close(bg)
	os.WriteFile(filepath.Join(dir, clusterFile), []byte(`{"nodes": -2}`), 0o600)
	if _, err := Open(Config{Dir: dir}, nil); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("corrupt cluster.json: %v, want ErrCorrupt", err)
	}
	s3, err := Open(Config{Dir: dir, Reset: true}, nil)
	if err != nil {
		t.Fatalf("reset: %v", err)
	}
	defer s3.Close(bg)
	if got := s3.ClusterNodes(); got != 0 {
		t.Fatalf("after reset: %d nodes, want 0", got)
	}
}
