package main

import (
	"flag"
	"fmt"
	"strconv"
	"strings"
)

// listFlag is a repeatable flag. Values from the environment twin come
// first as defaults; the first use on the command line replaces them, so
// that a flag always wins over its environment variable.
type listFlag struct {
	values  []string
	fromEnv bool
	check   func(string) error // validates one value; may be nil
}

func (l *listFlag) String() string { return strings.Join(l.values, " ") }

func (l *listFlag) Set(s string) error {
	if l.check != nil {
		if err := l.check(s); err != nil {
			return err
		}
	}
	if l.fromEnv {
		l.values, l.fromEnv = nil, false
	}
	l.values = append(l.values, s)
	return nil
}

// setEnv sets the values of the environment twin: several values are
// separated by white space (the -arm and -http-backend grammars have none).
func (l *listFlag) setEnv(v string) error {
	l.values = nil
	for _, s := range strings.Fields(v) {
		if err := l.Set(s); err != nil {
			return err
		}
	}
	l.fromEnv = true
	return nil
}

// runEnvName is the environment twin of a flag: -http-listen →
// SLUICE_HTTP_LISTEN.
func runEnvName(flagName string) string {
	return "SLUICE_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// applyEnv sets every flag in names from its SLUICE_* twin when the
// variable is set, before the command line is parsed: the environment
// gives defaults, the command line overrides them. A bad value names both.
func applyEnv(fs *flag.FlagSet, names []string, lookup func(string) (string, bool)) error {
	for _, name := range names {
		env := runEnvName(name)
		v, ok := lookup(env)
		if !ok {
			continue
		}
		f := fs.Lookup(name)
		var err error
		if l, isList := f.Value.(*listFlag); isList {
			err = l.setEnv(v)
		} else {
			err = fs.Set(name, v)
		}
		if err != nil {
			return fmt.Errorf("%s (-%s): %w", env, name, err)
		}
	}
	return nil
}

// flagNames returns the names of the flags defined on fs.
func flagNames(fs *flag.FlagSet) map[string]bool {
	m := map[string]bool{}
	fs.VisitAll(func(f *flag.Flag) { m[f.Name] = true })
	return m
}

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
