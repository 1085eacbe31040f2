package persist

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Override is one change an operator made at run time (through the admin
// listener or `sluice ctl`), kept in overrides.json so that it survives a
// restart.
//
// Precedence: at start, an override applies on top of the flags and files
// unless the configuration of the same setting changed since the override
// was made. Configured is the value the configuration gave when the
// override was made; if the configuration now gives something else, the
// operator changed it later, so the configuration wins and the override is
// dropped (see Reconcile).
type Override struct {
	// Key names the setting: "backend/PROTO/ID/drain", ".../disable",
	// ".../weight", "mop/PROTO/ID/pin", "arm/NAME".
	Key string `json:"key"`
	// Value is the value set, in the syntax of the flag or file that holds
	// the setting ("true", "3", an -arm rule); "" for a removed ARM rule.
	Value string `json:"value"`
	// Configured is the value the configuration gave when the override was
	// made ("" when it gave none).
	Configured string `json:"configured"`
	// By is who asked: the remote address, and the token's name.
	By string `json:"by,omitempty"`
	// At is when.
	At time.Time `json:"at"`
}

func decodeOverrides(data []byte) ([]Override, error) {
	var f struct {
		Overrides []Override `json:"overrides"`
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	for _, o := range f.Overrides {
		if err := checkOverrideKey(o.Key); err != nil {
			return nil, err
		}
		if seen[o.Key] {
			return nil, fmt.Errorf("override %q given twice", o.Key)
		}
		seen[o.Key] = true
	}
	return f.Overrides, nil
}

func checkOverrideKey(k string) error {
	if k == "" || len(k) > 512 || strings.ContainsAny(k, "\n\r") {
		return fmt.Errorf("override key %q: want a setting such as backend/http/h1/drain", k)
	}
	return nil
}

// Overrides returns the overrides as read at Open and changed since,
// sorted by key.
func (s *Store) Overrides() []Override {
	s.ovMu.Lock()
	defer s.ovMu.Unlock()
	return slices.Clone(s.overrides)
}

// SetOverride records o (replacing one with the same key) and writes
// overrides.json at once, atomically. When the directory cannot be written
// the error wraps ErrUnwritable; the override is kept in memory and written
// with the next change that works.
func (s *Store) SetOverride(o Override) error {
	if err := checkOverrideKey(o.Key); err != nil {
		return err
	}
	if o.At.IsZero() {
		o.At = s.cfg.Now()
	}
	return s.changeOverrides(func(ovs []Override) []Override {
		ovs = slices.DeleteFunc(ovs, func(x Override) bool { return x.Key == o.Key })
		return append(ovs, o)
	})
}

// DeleteOverrides removes the overrides of keys (an operator undid the
// change, or the configuration won) and writes overrides.json.
func (s *Store) DeleteOverrides(keys ...string) error {
	return s.changeOverrides(func(ovs []Override) []Override {
		return slices.DeleteFunc(ovs, func(x Override) bool { return slices.Contains(keys, x.Key) })
	})
}

func (s *Store) changeOverrides(f func([]Override) []Override) error {
	if s.cfg.ReadOnly {
		return fmt.Errorf("save overrides to %s: store is read-only", s.cfg.Dir)
	}
	if err := s.checkOpen(); err != nil {
		return fmt.Errorf("save overrides to %s: %w", s.cfg.Dir, err)
	}
	s.ovMu.Lock()
	s.overrides = f(s.overrides)
	slices.SortFunc(s.overrides, func(a, b Override) int { return strings.Compare(a.Key, b.Key) })
	if s.rc != nil {
		// An operator's change (not the data plane): written at once
		// when the store process answers, within its call timeout.
		s.rc.queueOverrides(slices.Clone(s.overrides))
		s.ovMu.Unlock()
		return s.writeThrough("overrides")
	}
	data, err := json.MarshalIndent(struct {
		Overrides []Override `json:"overrides"`
	}{s.overrides}, "", "  ")
	s.ovMu.Unlock()
	if err != nil {
		return err
	}
	return s.writeSmallFile(overridesFile, "overrides", append(data, '\n'))
}

// Reconcile splits overrides into those that apply on top of the
// configuration and those it now overrules. configured returns the value
// the configuration gives key now ("" for none). An override applies when
// that is still its Configured value; otherwise the flag or file changed
// after the override was made, and wins.
func Reconcile(overrides []Override, configured func(key string) string) (apply, dropped []Override) {
	for _, o := range overrides {
		if configured(o.Key) == o.Configured {
			apply = append(apply, o)
		} else {
			dropped = append(dropped, o)
		}
	}
	return apply, dropped
}
