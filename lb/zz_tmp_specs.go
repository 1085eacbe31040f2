package lb

// PoolSpec is the temporary stand-in of the pool settings an operator
// writes (-http-pool, -sip-pool); the real one lives in poolspec.go.
type PoolSpec struct {
	Name       string
	Policy     string
	HashKey    string
	HealthPath string
}
