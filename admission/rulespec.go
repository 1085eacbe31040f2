package admission

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// ParseLimit parses "N/UNIT" where UNIT is one of s, sec, second, m, min,
// minute, h, hour (a trailing "s" is allowed: "10/seconds").
func ParseLimit(s string) (limit int64, unit time.Duration, err error) {
	n, u, ok := strings.Cut(strings.TrimSpace(s), "/")
	if !ok {
		return 0, 0, fmt.Errorf("limit %q: want N/UNIT, e.g. 10/min", s)
	}
	limit, err = strconv.ParseInt(strings.TrimSpace(n), 10, 64)
	if err != nil || limit < 0 {
		return 0, 0, fmt.Errorf("limit %q: count must be a whole number >= 0", s)
	}
	switch strings.ToLower(strings.TrimSpace(u)) {
	case "s", "sec", "second", "secs", "seconds":
		unit = time.Second
	case "m", "min", "minute", "mins", "minutes":
		unit = time.Minute
	case "h", "hour", "hours":
		unit = time.Hour
	default:
		return 0, 0, fmt.Errorf("limit %q: unit must be one of s, sec, second, m, min, minute, h, hour", s)
	}
	return limit, unit, nil
}

// ParseRule parses the -arm flag grammar shared by HTTP and SIP:
//
//	name=api,proto=http,method=POST,host=example.com,path=/api/,pool=api,
//	limit=100/s,action=delay|reject|log,queue=500,wait=2s,qualify=10s,
//	low=50/s,lower=10/s
//
// Only name and limit are required. pool= names the pool the route chose
// (exact, lower case: see CheckPoolName), making the rule a budget of that
// pool alone; like the other match keys, an empty value matches any. A
// unit given in low or lower that differs from the limit's is kept in
// LowUnit/LowerUnit so that the meter can warn that it is ignored.
func ParseRule(s string) (RuleConfig, error) {
	var rc RuleConfig
	haveLimit := false
	for _, kv := range strings.Split(s, ",") {
		kv = strings.TrimSpace(kv)
		if kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return rc, fmt.Errorf("-arm %q: %q is not key=value", s, kv)
		}
		k, v = strings.ToLower(strings.TrimSpace(k)), strings.TrimSpace(v)
		var err error
		switch k {
		case "name":
			rc.Name = v
		case "proto":
			v = strings.ToLower(v)
			if v != "http" && v != "sip" && v != "any" && v != "" {
				err = fmt.Errorf("proto must be http or sip")
			}
			if v == "any" {
				v = ""
			}
			rc.Match.Proto = v
		case "method":
			rc.Match.Method = strings.ToUpper(v)
		case "host":
			rc.Match.Host = v
		case "path":
			rc.Match.PathPrefix = v
		case "pool":
			if v != "" {
				if perr := CheckPoolName(v); perr != nil {
					err = fmt.Errorf("%q: %w", v, perr)
				}
			}
			rc.Match.Pool = v
		case "limit":
			rc.Limit, rc.Unit, err = ParseLimit(v)
			haveLimit = err == nil
		case "low":
			rc.LowLimit, rc.LowUnit, err = ParseLimit(v)
		case "lower":
			rc.LowerLimit, rc.LowerUnit, err = ParseLimit(v)
		case "action":
			rc.Action, err = ParseAction(v)
		case "queue":
			rc.Queue, err = strconv.Atoi(v)
			if err == nil && rc.Queue < 1 {
				err = fmt.Errorf("queue must be >= 1")
			}
		case "wait":
			rc.MaxWait, err = time.ParseDuration(v)
		case "qualify":
			rc.Qualify, err = time.ParseDuration(v)
		default:
			err = fmt.Errorf("unknown key (want name, proto, method, host, path, pool, limit, action, queue, wait, qualify, low, lower)")
		}
		if err != nil {
			return rc, fmt.Errorf("-arm %q: %s: %w", s, k, err)
		}
	}
	if rc.Name == "" {
		return rc, fmt.Errorf("-arm %q: name is required", s)
	}
	if !haveLimit {
		return rc, fmt.Errorf("-arm %q: limit is required (e.g. limit=100/s)", s)
	}
	// A state limit inherits the rule's unit when its own was the same.
	if rc.LowUnit == rc.Unit {
		rc.LowUnit = 0
	}
	if rc.LowerUnit == rc.Unit {
		rc.LowerUnit = 0
	}
	if err := rc.Validate(); err != nil {
		return rc, fmt.Errorf("-arm %q: %w", s, err)
	}
	return rc, nil
}

// FormatRule writes rc in the -arm grammar, the same one ParseRule reads:
// ParseRule(FormatRule(rc)) gives rc back (with the default queue). Keys
// at their zero value are left out.
func FormatRule(rc RuleConfig) string {
	var b strings.Builder
	add := func(k, v string) {
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(k)
		b.WriteByte('=')
		b.WriteString(v)
	}
	add("name", rc.Name)
	if rc.Match.Proto != "" {
		add("proto", rc.Match.Proto)
	}
	if rc.Match.Method != "" {
		add("method", rc.Match.Method)
	}
	if rc.Match.Host != "" {
		add("host", rc.Match.Host)
	}
	if rc.Match.PathPrefix != "" {
		add("path", rc.Match.PathPrefix)
	}
	if rc.Match.Pool != "" {
		add("pool", rc.Match.Pool)
	}
	add("limit", fmt.Sprintf("%d/%s", rc.Limit, UnitName(rc.Unit)))
	if rc.Action != ActionDelay {
		add("action", rc.Action.String())
	}
	if rc.Queue != 0 && rc.Queue != 1000 {
		add("queue", strconv.Itoa(rc.Queue))
	}
	if rc.MaxWait != 0 {
		add("wait", rc.MaxWait.String())
	}
	if rc.Qualify != 0 {
		add("qualify", rc.Qualify.String())
	}
	for _, l := range []struct {
		key   string
		limit int64
		unit  time.Duration
	}{{"low", rc.LowLimit, rc.LowUnit}, {"lower", rc.LowerLimit, rc.LowerUnit}} {
		if l.limit == 0 {
			continue
		}
		u := l.unit
		if u == 0 {
			u = rc.Unit
		}
		add(l.key, fmt.Sprintf("%d/%s", l.limit, UnitName(u)))
	}
	return b.String()
}

// ChangeRule applies changes, key=value pairs of the -arm grammar
// ("limit=500/s,action=reject"), to rc and returns the result, validated.
// The name cannot change.
func ChangeRule(rc RuleConfig, changes string) (RuleConfig, error) {
	if strings.TrimSpace(changes) == "" {
		return rc, fmt.Errorf("arm rule %s: no change given (want key=value pairs, e.g. limit=500/s)", rc.Name)
	}
	for _, kv := range strings.Split(changes, ",") {
		k, _, _ := strings.Cut(kv, "=")
		if strings.EqualFold(strings.TrimSpace(k), "name") {
			return rc, fmt.Errorf("arm rule %s: the name cannot change (remove the rule and add one)", rc.Name)
		}
	}
	out, err := ParseRule(FormatRule(rc) + "," + changes)
	if err != nil {
		return rc, fmt.Errorf("arm rule %s: %w", rc.Name, err)
	}
	return out, nil
}

// ParseRuleFile parses the content of an ARM rules file (-arm-file): one
// rule a line in the -arm grammar, blank lines and lines starting with #
// skipped. Errors name the file and line; the set is checked as a whole
// (unique names).
func ParseRuleFile(file string, data []byte) ([]RuleConfig, error) {
	var rules []RuleConfig
	where := map[string]int{}
	for i, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		rc, err := ParseRule(line)
		if err != nil {
			return nil, fmt.Errorf("-arm-file %s:%d: %w", file, i+1, err)
		}
		if first, dup := where[rc.Name]; dup {
			return nil, fmt.Errorf("-arm-file %s:%d: rule name %q already used on line %d", file, i+1, rc.Name, first)
		}
		where[rc.Name] = i + 1
		rules = append(rules, rc)
	}
	return rules, nil
}
