package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/sluicelb/sluice/admission"
	"github.com/sluicelb/sluice/internal/opfile"
	"github.com/sluicelb/sluice/node"
)

// One mechanism reads the flags of every command: the command line, then
// each flag's SLUICE_* environment twin, then the file named by -config.
// A source only sets the flags that a source before it left alone, so the
// command line wins over the environment and the environment over the
// file. A bad value from any of them stops the command with a message
// naming the flag and where the value came from.

// listFlag is a repeatable flag: each use adds a value.
type listFlag struct {
	values []string
	check  func(string) error // validates one value; may be nil
	// from is where each value came from ("command line", a SLUICE_*
	// variable, "-config FILE:LINE"), by index; source is where the
	// values being set now come from (parseFlags sets it).
	from   []string
	source string
}

func (l *listFlag) String() string { return strings.Join(l.values, " ") }

func (l *listFlag) Set(s string) error {
	if l.check != nil {
		if err := l.check(s); err != nil {
			return err
		}
	}
	l.values = append(l.values, s)
	src := l.source
	if src == "" {
		src = "command line"
	}
	l.from = append(l.from, src)
	return nil
}

// sourceOf says where value v of the flag came from, "" if it is not one
// of its values.
func (l *listFlag) sourceOf(v string) string {
	for i, x := range l.values {
		if x == v && i < len(l.from) {
			return l.from[i]
		}
	}
	return ""
}

// setSource tells f, when it is a listFlag, where the next values come
// from.
func setSource(f *flag.Flag, src string) {
	if l, ok := f.Value.(*listFlag); ok {
		l.source = src
	}
}

// sourcedError names where a value a library refused came from: a
// node.ValueError (a route to a pool without backends, an ARM rule naming
// no pool) gets the source of its value, when fs has it.
func sourcedError(fs *flag.FlagSet, err error) error {
	var ve *node.ValueError
	if fs == nil || !errors.As(err, &ve) {
		return err
	}
	f := fs.Lookup(strings.TrimPrefix(ve.Flag, "-"))
	if f == nil {
		return err
	}
	l, ok := f.Value.(*listFlag)
	if !ok {
		return err
	}
	src := l.sourceOf(ve.Value)
	if src == "" {
		return err
	}
	return &namedFlagError{msg: fmt.Sprintf("%s %q (%s): %v", ve.Flag, ve.Value, src, ve.Err), err: err}
}

// envSplit marks a listFlag: its environment twin holds several values
// separated by white space (the -arm and backend grammars have none).
func (l *listFlag) envSplit() {}

// envName is the environment twin of a flag: -http-listen →
// SLUICE_HTTP_LISTEN.
func envName(flagName string) string {
	return "SLUICE_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// configFlag is the flag naming the config file; every command has it.
const configFlag = "config"

// flagSetMade, when set, is told of every flag set a command makes, so
// that a test can walk the flags of every command.
var flagSetMade func(cmd string, fs *flag.FlagSet)

// newFlagSet returns the flag set of a command, with -config defined.
func newFlagSet(cmd string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	if flagSetMade != nil {
		flagSetMade(cmd, fs)
	}
	fs.String(configFlag, "", "read flags from this `file`: one \"name value\" a line (the flag name without -, a repeatable flag on several lines; # comments); the command line and SLUICE_* variables win over it")
	return fs
}

// parseFlags sets fs's flags from args, then from their SLUICE_* twins
// (lookup is os.LookupEnv outside tests), then from the -config file.
// Errors of the command line are printed by the flag package; the others
// are returned naming the flag and the source of the bad value.
func parseFlags(fs *flag.FlagSet, args []string, lookup func(string) (string, bool)) error {
	// The flag package prints a bad value's error and then the whole
	// usage, 200 lines that push the error off the screen: -help gets the
	// usage, a bad flag its error, what the value should be and that
	// flag's own help.
	out := fs.Output()
	var printed bytes.Buffer
	fs.SetOutput(&printed)
	err := fs.Parse(args)
	fs.SetOutput(out)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			out.Write(printed.Bytes())
		} else {
			printFlagError(out, fs, err)
		}
		return printedError{err}
	}
	if fs.NArg() > 0 {
		return unexpectedArg(fs, args)
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	markRenamed(set)
	fs.VisitAll(func(f *flag.Flag) {
		if err != nil || set[f.Name] {
			return
		}
		env := envName(f.Name)
		v, ok := lookup(env)
		if !ok {
			return
		}
		setSource(f, env)
		if err = setFromEnv(fs, f, v); err != nil {
			err = fmt.Errorf("%s (-%s): invalid value %q: %w%s", env, f.Name, v, err, wantValue(f, err))
		}
	})
	if err != nil {
		return err
	}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	markRenamed(set)
	if f := fs.Lookup(configFlag); f != nil && f.Value.String() != "" {
		return readConfigFile(fs, f.Value.String(), set)
	}
	return nil
}

// unexpectedArg is the error of the first argument the flags left; when
// it follows a bool flag it is a value given with a space, which the flag
// package leaves as an argument: the error says to write it with "=".
func unexpectedArg(fs *flag.FlagSet, args []string) error {
	arg := fs.Arg(0)
	if i := len(args) - fs.NArg(); i > 0 {
		prev := strings.TrimLeft(args[i-1], "-")
		if f := fs.Lookup(prev); f != nil && isBoolFlag(f) && !strings.Contains(args[i-1], "=") {
			return fmt.Errorf("unexpected argument %q after -%s: a true/false flag takes its value with =, as -%s=%s", arg, f.Name, f.Name, arg)
		}
	}
	return fmt.Errorf("unexpected argument %q", arg)
}

// isBoolFlag reports whether f is a true/false flag (set without a value).
func isBoolFlag(f *flag.Flag) bool {
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// printFlagError prints an error of the command line: the flag
// package's message, what the value should be, the flag's help line, and
// where the rest is.
func printFlagError(w io.Writer, fs *flag.FlagSet, err error) {
	msg := err.Error()
	var f *flag.Flag
	if _, rest, ok := strings.Cut(msg, " for flag -"); ok {
		name, _, _ := strings.Cut(rest, ":")
		f = fs.Lookup(name)
	}
	if f == nil {
		fmt.Fprintf(w, "%s\n'sluice %s -help' lists every flag.\n", msg, fs.Name())
		return
	}
	fmt.Fprintf(w, "%s%s\n\n%s\n'sluice %s -help' lists every flag.\n", msg, wantValue(f, err), flagLine(f), fs.Name())
}

// wantValue says what a flag of a standard type takes when the flag
// package refused its value with no more than "parse error" or "value out
// of range"; "" otherwise (the other values explain themselves).
func wantValue(f *flag.Flag, err error) string {
	m := err.Error()
	if !strings.HasSuffix(m, "parse error") && !strings.HasSuffix(m, "value out of range") {
		return ""
	}
	if isBoolFlag(f) {
		return "; want true or false"
	}
	switch kind, _ := flag.UnquoteUsage(f); kind {
	case "int", "uint":
		return "; want a whole number, without a unit"
	case "duration":
		return "; want a duration with its unit, e.g. 500ms, 10s, 5m or 1h30m"
	case "float":
		return "; want a number"
	}
	return ""
}

// runFlagNames is the set of `sluice run`'s flags, which a -config file
// written for the node may hold when another command reads it.
var runFlagNames = sync.OnceValue(func() map[string]bool {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	newRunFlags(fs)
	names := map[string]bool{}
	fs.VisitAll(func(f *flag.Flag) { names[f.Name] = true })
	return names
})

func setFromEnv(fs *flag.FlagSet, f *flag.Flag, v string) error {
	if _, list := f.Value.(interface{ envSplit() }); list {
		for _, s := range strings.Fields(v) {
			if err := fs.Set(f.Name, s); err != nil {
				return err
			}
		}
		return nil
	}
	return fs.Set(f.Name, v)
}

// readConfigFile sets the flags not in skip from file: one "name value"
// a line, name being the flag's name with or without a leading -, value
// the rest of the line (may be empty); blank lines and lines starting with
// # are skipped. Errors name the file, the line and the flag.
func readConfigFile(fs *flag.FlagSet, file string, skip map[string]bool) error {
	data, err := opfile.Read(file, opfile.MaxSize)
	if err != nil {
		return fmt.Errorf("-%s: %w", configFlag, err)
	}
	for i, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, value, _ := strings.Cut(line, " ")
		if j := strings.IndexByte(line, '\t'); j >= 0 && (j < len(name)) {
			name, value = line[:j], line[j+1:]
		}
		name, value = strings.TrimLeft(name, "-"), strings.TrimSpace(value)
		where := fmt.Sprintf("-%s %s:%d", configFlag, file, i+1)
		f := fs.Lookup(name)
		switch {
		case f == nil && fs.Name() != "run" && runFlagNames()[name]:
			// The node's own file: `sluice events -config` and `sluice
			// ctl -config` take what they know from it (-data-dir).
			continue
		case f == nil:
			return fmt.Errorf("%s: unknown flag %q", where, name)
		case name == configFlag:
			return fmt.Errorf("%s: a config file cannot name another", where)
		case skip[name]:
			continue
		}
		setSource(f, where)
		if err := fs.Set(name, value); err != nil {
			return fmt.Errorf("%s: -%s: invalid value %q: %w%s", where, name, value, err, wantValue(f, err))
		}
	}
	return nil
}

// parseCommand is parseFlags for a command's run function: it returns
// the exit status to stop with (0 after -help, 2 for a bad value) and
// whether to go on.
func parseCommand(cmd string, fs *flag.FlagSet, args []string, stderr io.Writer) (int, bool) {
	err := parseFlags(fs, args, os.LookupEnv)
	if err == nil {
		err = checkZeroNotOff(fs)
	}
	switch {
	case err == nil:
		return 0, true
	case errors.Is(err, flag.ErrHelp):
		return 0, false
	}
	if !errors.As(err, new(printedError)) {
		fmt.Fprintf(stderr, "sluice %s: %v\n", cmd, err)
	}
	return 2, false
}

// zeroIsDefault are flags whose library reads 0 as "the default": given
// 0, they would run with the default (256 connections, 10 s, ...), while
// 0 turns other new flags off (-sip-unknown-dialog-source-rate) or
// derives them (-http-max-conns): 0 is refused rather than guessed.
var zeroIsDefault = []string{"sip-tcp-max-conns-per-source", "sip-tcp-first-message-timeout", "sip-tcp-partial-budget", "sip-tcp-max-conns", "sip-dialog-max", "cluster-dialog-max"}

// checkZeroNotOff refuses 0 for a flag of zeroIsDefault that was set.
func checkZeroNotOff(fs *flag.FlagSet) error {
	var err error
	fs.Visit(func(f *flag.Flag) {
		if err == nil && slices.Contains(zeroIsDefault, f.Name) && (f.Value.String() == "0" || f.Value.String() == "0s") {
			err = fmt.Errorf("-%s 0: want a positive value (default %s); 0 does not lift the limit", f.Name, f.DefValue)
		}
	})
	return err
}

// printedError is an error of the command line, which the flag package
// has printed already, with the usage.
type printedError struct{ err error }

func (e printedError) Error() string { return e.err.Error() }
func (e printedError) Unwrap() error { return e.err }

// flagError puts the flag in front of a library's error about one of its
// Config fields, and speaks of flags where the library speaks of its
// fields ("sip: TCPPartialBudget: must be at least twice MaxMessage + 1"
// becomes "-sip-tcp-partial-budget: must be at least twice
// -sip-max-message + 1"); other errors come back as they are. The result
// still wraps err.
func flagError(err error) error {
	var fe *admission.FieldError
	if !errors.As(err, &fe) {
		return err
	}
	pkg, field := fe.ConfigField()
	flags := fieldFlags()
	f, ok := flags[pkg+"."+field]
	if !ok {
		return err
	}
	msg := err.Error()
	if fe.Err != nil {
		cause := strings.TrimPrefix(fe.Err.Error(), pkg+": bad configuration: ")
		// The fields of the same struct as the one at fault: "MaxMessage"
		// of sip.Config, "Interval" of lb's HealthConfig.
		typ := field[:strings.LastIndexByte(field, '.')+1]
		for key, name := range flags {
			if other, ok := strings.CutPrefix(key, pkg+"."+typ); ok && !strings.Contains(other, ".") {
				cause = regexp.MustCompile(`\b`+regexp.QuoteMeta(other)+`\b`).ReplaceAllLiteralString(cause, "-"+name)
			}
		}
		msg = strings.Replace(msg, fe.Error(), cause, 1)
	}
	return &namedFlagError{msg: "-" + f + ": " + msg, err: err}
}

// namedFlagError is flagError's result: the operator's words, the
// library's error underneath.
type namedFlagError struct {
	msg string
	err error
}

func (e *namedFlagError) Error() string { return e.msg }
func (e *namedFlagError) Unwrap() error { return e.err }

// byteSize is a flag holding a size in bytes: a plain number or one with
// a unit (K, M, G, T, with or without "B"/"iB"; all powers of 1024).
type byteSize int64

func (b *byteSize) String() string { return strconv.FormatInt(int64(*b), 10) }

func (b *byteSize) Set(s string) error {
	n, err := parseBytes(s)
	if err != nil {
		return err
	}
	*b = byteSize(n)
	return nil
}

func parseBytes(s string) (int64, error) {
	t := strings.TrimSpace(s)
	i := len(t)
	for i > 0 && (t[i-1] < '0' || t[i-1] > '9') {
		i--
	}
	num, unit := t[:i], strings.ToLower(strings.TrimSpace(t[i:]))
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("size %q: want a whole number of bytes, e.g. 512MiB", s)
	}
	shift := 0
	switch strings.TrimSuffix(strings.TrimSuffix(unit, "b"), "i") {
	case "":
	case "k":
		shift = 10
	case "m":
		shift = 20
	case "g":
		shift = 30
	case "t":
		shift = 40
	default:
		return 0, fmt.Errorf("size %q: unknown unit %q (want K, M, G or T)", s, unit)
	}
	if n > (1<<62)>>shift {
		return 0, fmt.Errorf("size %q: too large", s)
	}
	return n << shift, nil
}

// fraction is a flag holding a share in (0,1]; a value above 1 and at most
// 100 is read as a percentage (-mop-max-heap 85 is 0.85).
type fraction float64

func (f *fraction) String() string { return strconv.FormatFloat(float64(*f), 'g', -1, 64) }

func (f *fraction) Set(s string) error {
	v, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(s), "%"), 64)
	if err != nil {
		return fmt.Errorf("%q is not a number", s)
	}
	if v > 1 && v <= 100 {
		v /= 100
	}
	*f = fraction(v)
	return nil
}

// panicShare is -health-panic: a fraction with the range (0, 1] checked
// when it is set (0 would silently become the default).
type panicShare float64

func (p *panicShare) String() string { return (*fraction)(p).String() }

func (p *panicShare) Set(s string) error {
	if err := (*fraction)(p).Set(s); err != nil {
		return err
	}
	if *p <= 0 || *p > 1 {
		return fmt.Errorf("%q: want a share in (0%%, 100%%]", s)
	}
	return nil
}

// settingLines renders the resolved value of every flag of fs in the
// -config file syntax, one "name value" a line, for GET /control/config:
// the backends and ARM rules in force are written by the node itself
// (they change at run time), and -config, which a file cannot name, is
// left out, as are empty values (a flag's empty default). A repeatable
// flag gives one line per value.
func settingLines(fs *flag.FlagSet, skip ...string) []string {
	var out []string
	fs.VisitAll(func(f *flag.Flag) {
		if _, old := renamedFlags[f.Name]; old || f.Name == configFlag || slices.Contains(skip, f.Name) {
			return
		}
		if l, ok := f.Value.(*listFlag); ok {
			for _, v := range l.values {
				out = append(out, f.Name+" "+v)
			}
			return
		}
		if v := f.Value.String(); v != "" {
			out = append(out, f.Name+" "+v)
		}
	})
	return out
}
