package main

import (
	"flag"
	"fmt"
	"io"
	"strings"
)

// flagGroups orders the areas of `sluice run -help` and says which flag
// prefixes belong to each.
var flagGroups = []struct {
	title    string
	prefixes []string
}{
	{"HTTP front end", []string{"http-", "https-"}},
	{"SIP front end", []string{"sip-"}},
	{"TLS (certificates and handshakes of every TLS listener)", []string{"tls-"}},
	{"Backend selection and health", []string{"lb-", "health-", "backends-file", "dns-"}},
	{"ARM rules (arrival rate meters)", []string{"arm"}},
	{"MOP (memory overload protection per backend)", []string{"mop-"}},
	{"Node memory states", []string{"mem-"}},
	{"Persistence and event log", []string{"data-", "persist-", "events-"}},
	{"Cluster (several nodes sharing budgets through Redis)", []string{"cluster-"}},
	{"Operations", []string{""}},
}

// groupedUsage prints fs's flags grouped by area, each with its default and
// its environment twin.
func groupedUsage(w io.Writer, cmd string, fs *flag.FlagSet) {
	fmt.Fprintf(w, "usage: sluice %s [flags]\n\nEvery flag can also be set by its environment twin, e.g. -http-listen by SLUICE_HTTP_LISTEN,\nor in the file of -config FILE, a line \"http-listen :8080\" each; the command line wins over the\nenvironment, the environment over the file.\n", cmd)
	seen := map[string]bool{}
	for _, g := range flagGroups {
		var lines []string
		fs.VisitAll(func(f *flag.Flag) {
			if seen[f.Name] {
				return
			}
			for _, p := range g.prefixes {
				if strings.HasPrefix(f.Name, p) {
					seen[f.Name] = true
					lines = append(lines, flagLine(f))
					return
				}
			}
		})
		if len(lines) == 0 {
			continue
		}
		fmt.Fprintf(w, "\n%s:\n%s", g.title, strings.Join(lines, ""))
	}
}

func flagLine(f *flag.Flag) string {
	name, usage := flag.UnquoteUsage(f)
	s := "  -" + f.Name
	if name != "" {
		s += " " + name
	}
	s += "\n        " + strings.ReplaceAll(usage, "\n", "\n        ")
	if f.DefValue != "" && f.DefValue != "0" && f.DefValue != "false" && f.DefValue != "[]" {
		s += fmt.Sprintf(" (default %s)", f.DefValue)
	}
	return s + "\n"
}
