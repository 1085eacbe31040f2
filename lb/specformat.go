package lb

import (
	"strconv"
	"strings"
)

// FormatBackendSpec writes b in the grammar ParseBackendSpec reads, keys
// at their default left out: ParseBackendSpec(proto, FormatBackendSpec(proto, b))
// gives b back.
func FormatBackendSpec(proto string, b BackendSpec) string {
	parts := []string{b.Addr}
	if b.ID != "" && b.ID != b.Addr {
		parts = append(parts, "id="+b.ID)
	}
	if b.Weight > 1 {
		parts = append(parts, "weight="+strconv.Itoa(b.Weight))
	}
	if b.MetricsURL != "" {
		parts = append(parts, "metrics="+b.MetricsURL)
	}
	if b.HealthPath != "" && proto == "http" {
		parts = append(parts, "health="+b.HealthPath)
	}
	if b.TLS && proto == "http" {
		parts = append(parts, "tls=on")
	}
	if b.DNS.Kind == "srv" || b.DNS.Kind == "naptr" {
		if b.DNS.Transport != "" && proto == "sip" {
			parts = append(parts, "transport="+b.DNS.Transport)
		}
	} else if b.Transport != "" && b.Transport != "udp" && proto == "sip" {
		parts = append(parts, "transport="+b.Transport)
	}
	if b.CAFile != "" {
		parts = append(parts, "ca="+b.CAFile)
	}
	if b.SNI != "" {
		parts = append(parts, "sni="+b.SNI)
	}
	if b.Proxy != 0 {
		parts = append(parts, "proxy=v"+strconv.Itoa(int(b.Proxy)))
	}
	if len(b.Pools) != 1 || b.Pools[0] != DefaultPool {
		for _, p := range b.Pools {
			parts = append(parts, "pool="+p)
		}
	}
	return strings.Join(parts, ",")
}
