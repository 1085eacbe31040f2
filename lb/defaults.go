package lb

import "time"

// DefaultPolicy is the selection policy of a pool that names none (flag
// -lb-policy): the first of PolicyNames.
var DefaultPolicy = PolicyNames[0]

// DefaultPassiveConfig returns passive ejection's defaults (flags
// -health-max-fails and -health-cooldown): 3 failures in a row eject a
// backend for 10 s.
func DefaultPassiveConfig() PassiveConfig {
	return PassiveConfig{MaxFails: 3, Cooldown: defaultCooldown}
}

// DefaultPoolConfig returns a pool's defaults: DefaultPolicy and
// DefaultPassiveConfig.
func DefaultPoolConfig() PoolConfig {
	return PoolConfig{Policy: DefaultPolicy, Passive: DefaultPassiveConfig()}
}

// DefaultMemoryProbeConfig returns a memory probe's defaults but its URL
// (flags -mop-used-metric, -mop-max-metric, -mop-probe-interval and
// -mop-probe-max-bytes): JVM heap series, polled every second, answers of
// at most MaxMetricsWire bytes.
func DefaultMemoryProbeConfig() MemoryProbeConfig {
	return MemoryProbeConfig{UsedMetric: DefaultUsedMetric, MaxMetric: DefaultMaxMetric, Interval: time.Second, MaxBytes: MaxMetricsWire}
}
