package node

import (
	"net/netip"

	lbhttp "github.com/sluicelb/sluice/http"
	"github.com/sluicelb/sluice/proxyproto"
	lbsip "github.com/sluicelb/sluice/sip"
)

// The front ends' settings as the node takes them: a command line fills
// these through node alone, so that it depends on no front end package
// and every front end is wired in one place (New).

// HTTPConfig configures the HTTP front end (Config.HTTP).
type HTTPConfig = lbhttp.Config

// SIPConfig configures the SIP front end (Config.SIP); its Backends come
// from Config.SIPBackends.
type SIPConfig = lbsip.Config

// DefaultHTTPConfig returns the HTTP front end's defaults, the ones its
// flags show.
func DefaultHTTPConfig() HTTPConfig { return lbhttp.DefaultConfig() }

// DefaultSIPConfig returns the SIP front end's defaults, the ones its
// flags show.
func DefaultSIPConfig() SIPConfig { return lbsip.DefaultConfig() }

// CheckHTTPBackend validates one -http-backend spec, ADDR[,key=value...],
// so that a bad one is refused when the flag is read.
func CheckHTTPBackend(spec string) error {
	_, err := lbhttp.ParseBackend(spec)
	return err
}

// CheckSIPBackend validates one -sip-backend spec, ADDR[,key=value...].
func CheckSIPBackend(spec string) error {
	_, err := lbsip.ParseBackend(spec)
	return err
}

// CheckSIPSettings validates a SIP front end's settings, backends aside,
// as New would.
func CheckSIPSettings(c SIPConfig) error { return lbsip.CheckSettings(c) }

// CheckProxyProtocolFrom validates one -proxy-protocol-from value: a CIDR
// or address, or a comma-separated list of them.
func CheckProxyProtocolFrom(s string) error {
	_, err := proxyproto.ParseTrusted(s)
	return err
}

// proxyProtocolFrom is the node's -proxy-protocol-from networks.
func (n *Node) proxyProtocolFrom() ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range n.cfg.ProxyFrom {
		nets, err := proxyproto.ParseTrusted(s)
		if err != nil {
			return nil, err
		}
		out = append(out, nets...)
	}
	return out, nil
}

// CheckTrustedProxies validates one -http-trusted-proxy value: a CIDR or
// address, or a comma-separated list of them.
func CheckTrustedProxies(s string) error {
	_, err := lbhttp.ParseTrustedProxies(s)
	return err
}
