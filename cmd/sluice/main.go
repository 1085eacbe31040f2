// Command sluice is a SIP and HTTP load balancer that protects the servers
// behind it from overload.
//
// Usage:
//
//	sluice <command> [flags]
//
// Each command lives in its own file and registers itself in init.
package main

import (
	"fmt"
	"io"
	"os"
	"sort"
)

// command is one subcommand: it parses its own flags from args and returns
// the process exit status (2 for bad usage).
type command struct {
	summary string
	run     func(args []string, stdout, stderr io.Writer) int
}

var commands = map[string]command{}

// register adds a subcommand; called from init in the command's file.
func register(name, summary string, run func(args []string, stdout, stderr io.Writer) int) {
	if _, dup := commands[name]; dup {
		panic("sluice: command registered twice: " + name)
	}
	commands[name] = command{summary: summary, run: run}
}

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func init() {
	register("version", "print the version", func(_ []string, stdout, _ io.Writer) int {
		fmt.Fprintln(stdout, "sluice", version)
		return 0
	})
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: sluice <command> [flags]")
	fmt.Fprintln(w, "\ncommands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-10s %s\n", n, commands[n].summary)
	}
	fmt.Fprintln(w, "\nRun 'sluice <command> -help' for the flags of a command.")
}

func main() {
	os.Exit(dispatch(os.Args[1:], os.Stdout, os.Stderr))
}

func dispatch(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return 2
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		usage(stdout)
		fs := newFlagSet("run", stdout)
		newRunFlags(fs)
		fmt.Fprintln(stdout)
		groupedUsage(stdout, "run", fs)
		return 0
	case "-version", "--version":
		args[0] = "version"
	case storeChildName: // hidden: the store process, started by run
		return runStoreChild(args[1:], stderr)
	}
	c, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "sluice: unknown command %q\n", args[0])
		usage(stderr)
		return 2
	}
	return c.run(args[1:], stdout, stderr)
}
