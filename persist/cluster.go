package persist

import (
	"encoding/json"
	"fmt"
	"strconv"
)

// clusterFile holds what a cluster node must know when it starts while
// Redis is away: the number of nodes it last saw, so that the fail policy
// "local" enforces limit ÷ that count rather than the whole limit.
const clusterFile = "cluster.json"

// clusterState is the content of cluster.json.
type clusterState struct {
	Nodes int64 `json:"nodes"`
}

// ClusterNodes returns the node count last saved with SetClusterNodes (as
// read at Open and changed since), 0 when none was.
func (s *Store) ClusterNodes() int64 {
	s.ovMu.Lock()
	defer s.ovMu.Unlock()
	return s.clusterNodes
}

// SetClusterNodes saves the node count of the cluster at once, atomically,
// when it changed. When the directory cannot be written the error wraps
// ErrUnwritable and the count is kept in memory.
func (s *Store) SetClusterNodes(n int64) error {
	if n < 1 {
		return fmt.Errorf("save cluster node count %d: must be at least 1", n)
	}
	if s.cfg.ReadOnly {
		return fmt.Errorf("save cluster node count to %s: store is read-only", s.cfg.Dir)
	}
	if err := s.checkOpen(); err != nil {
		return fmt.Errorf("save cluster node count to %s: %w", s.cfg.Dir, err)
	}
	s.ovMu.Lock()
	same := s.clusterNodes == n
	s.clusterNodes = n
	s.ovMu.Unlock()
	if same {
		return nil
	}
	if s.rc != nil {
		s.rc.queueCluster(n)
		return s.writeThrough("cluster node count")
	}
	data, _ := json.Marshal(clusterState{Nodes: n})
	return s.writeSmallFile(clusterFile, "cluster node count", append(data, '\n'))
}

// decodeCluster reads cluster.json.
func decodeCluster(data []byte) (int64, error) {
	var st clusterState
	if err := json.Unmarshal(data, &st); err != nil {
		return 0, err
	}
	if st.Nodes < 1 {
		return 0, fmt.Errorf("node count %s: must be at least 1", strconv.FormatInt(st.Nodes, 10))
	}
	return st.Nodes, nil
}
