package node

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"time"

	"github.com/sluicelb/sluice/demo"
	"github.com/sluicelb/sluice/demo/sipdemo"
)

// Demo is the embedded backends of `sluice demo`: two HTTP and two SIP
// servers on loopback that hold real memory per session.
type Demo struct {
	http []*demo.HTTPBackend
	sip  []*sipdemo.UAS
}

func (d *Demo) Close() {
	for _, b := range d.http {
		b.Close()
	}
	for _, u := range d.sip {
		u.Close()
	}
}

// StartDemo starts two HTTP and two SIP backends on loopback. Each
// session or dialog holds 64 KiB for up to 30 s against a 64 MiB maximum,
// so a backend fills at about 34 new sessions per second and MOP's 85%
// ceiling sits near 29 per second.
func StartDemo(logger *slog.Logger) (*Demo, error) {
	d := &Demo{}
	for i := 1; i <= 2; i++ {
		b, err := demo.NewHTTPBackend(demo.HTTPBackendConfig{Name: fmt.Sprintf("h%d", i), Logger: logger})
		if err != nil {
			d.Close()
			return nil, fmt.Errorf("demo http backend: %w", err)
		}
		d.http = append(d.http, b)
		u, err := sipdemo.New(sipdemo.Config{Name: fmt.Sprintf("s%d", i), Logger: logger})
		if err != nil {
			d.Close()
			return nil, fmt.Errorf("demo sip backend: %w", err)
		}
		d.sip = append(d.sip, u)
	}
	return d, nil
}

// Args are the run flags that put the demo backends behind the balancer.
func (d *Demo) Args() []string {
	var a []string
	for _, b := range d.http {
		a = append(a, "-http-backend", fmt.Sprintf("%s,metrics=%s,id=%s", b.Addr(), b.MetricsURL(), b.Name()))
	}
	for _, u := range d.sip {
		a = append(a, "-sip-backend", fmt.Sprintf("%s,metrics=%s,id=%s", u.Addr(), u.MetricsURL(), u.Name()))
	}
	return a
}

// PrintHelp prints where the demo listens and commands to try.
func (d *Demo) PrintHelp(w io.Writer, httpAddr, adminAddr net.Addr, sipAddr string) {
	fmt.Fprintln(w, "sluice demo is up.")
	fmt.Fprintln(w)
	if httpAddr != nil {
		fmt.Fprintf(w, "  HTTP   http://%s   -> %s, %s\n", httpAddr, d.http[0].Addr(), d.http[1].Addr())
	}
	fmt.Fprintf(w, "  SIP    udp/tcp %s  -> %s, %s\n", sipAddr, d.sip[0].Addr(), d.sip[1].Addr())
	if adminAddr != nil {
		fmt.Fprintf(w, "  admin  http://%s   (/status /metrics /events /healthz /control)\n", adminAddr)
	}
	fmt.Fprintln(w, "\nEach new session holds 64 KiB in its backend for 30 s (64 MiB max): MOP learns about 29 new sessions/s per backend.")
	fmt.Fprintln(w, "\nTry:")
	if httpAddr != nil {
		fmt.Fprintf(w, "  curl -si -c /tmp/sluice.jar -b /tmp/sluice.jar http://%s/          # a sticky session\n", httpAddr)
		fmt.Fprintf(w, "  wrk -t2 -c20 -d60s http://%s/                                   # every request new work: watch MOP refuse\n", httpAddr)
	}
	fmt.Fprintf(w, "  sipp -sn uac -r 20 -d 10000 -m 2000 %s                          # calls of 10 s, none refused; BYEs always pass\n", sipAddr)
	if adminAddr != nil {
		fmt.Fprintf(w, "  watch -n1 'curl -s http://%s/status'\n", adminAddr)
		fmt.Fprintf(w, "  curl -s 'http://%s/events?limit=20'\n", adminAddr)
		fmt.Fprintf(w, "  sluice ctl -admin %s drain h1                   # h1 gets no new work; its sticky sessions stay (undrain h1)\n", adminAddr)
	}
	fmt.Fprintf(w, "\nStop with Ctrl-C (drains for up to -drain-timeout). Started %s.\n", time.Now().Format(time.RFC3339))
}
