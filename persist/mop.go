package persist

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/sluicelb/sluice/admission"
)

// MOPKey names the learned state of one backend: protocol and backend
// address joined by a slash, e.g. "http/127.0.0.1:18081". It is stored
// under "mop/" + MOPKey(...).
func MOPKey(proto, addr string) string { return proto + "/" + addr }

// checkMOPKey reports why key is not a valid MOPKey, if it is not.
func checkMOPKey(key string) error {
	proto, addr, ok := strings.Cut(key, "/")
	switch {
	case !ok || proto == "" || addr == "":
		return errors.New("want protocol/address")
	case len(key) > 512:
		return errors.New("longer than 512 bytes")
	case !utf8.ValidString(key):
		return errors.New("not UTF-8")
	case strings.ContainsFunc(key, func(r rune) bool { return !unicode.IsPrint(r) || r == ' ' }):
		return errors.New("contains a space or control character")
	}
	return nil
}

// parseMOPKey returns the MOPKey of a stored key "mop/<proto>/<addr>".
func parseMOPKey(k []byte) (string, error) {
	rest, ok := bytes.CutPrefix(k, mopPrefix)
	if !ok {
		return "", errors.New("not a mop key")
	}
	key := string(rest)
	if err := checkMOPKey(key); err != nil {
		return "", fmt.Errorf("mop key %q: %w", key, err)
	}
	return key, nil
}

// checkMOP reports why a state cannot be stored or used, if it cannot.
// Rates are 0 (none) or in (0, admission.MaxMOPRate]: a rate above it
// would turn MOP off. The configured floor (MOPConfig.MinRate) is
// checked by MOP.Import.
func checkMOP(st admission.MOPState) error {
	switch {
	case st.Phase != admission.Discovery && st.Phase != admission.Learned:
		return fmt.Errorf("unknown phase %d", st.Phase)
	case !finite(st.LearnedRate) || st.LearnedRate < 0 || st.LearnedRate > admission.MaxMOPRate:
		return fmt.Errorf("learned rate %g is not a number of requests per second in [0, %g]", st.LearnedRate, float64(admission.MaxMOPRate))
	case !finite(st.AllowedRate) || st.AllowedRate < 0 || st.AllowedRate > admission.MaxMOPRate:
		return fmt.Errorf("allowed rate %g is not a number of requests per second in [0, %g]", st.AllowedRate, float64(admission.MaxMOPRate))
	case !finite(st.Base) || !finite(st.Slope):
		return fmt.Errorf("model base %g, slope %g: not finite", st.Base, st.Slope)
	}
	return nil
}

func finite(f float64) bool { return !math.IsNaN(f) && !math.IsInf(f, 0) }

// encodeMOP is the stored value of a state: its JSON form.
func encodeMOP(st admission.MOPState) ([]byte, error) {
	if err := checkMOP(st); err != nil {
		return nil, err
	}
	return json.Marshal(st)
}

// decodeMOP parses a stored state and checks that it can be used.
func decodeMOP(v []byte) (admission.MOPState, error) {
	var st admission.MOPState
	if len(v) == 0 || v[0] != '{' {
		return st, errors.New("mop state: not a JSON object")
	}
	if err := json.Unmarshal(v, &st); err != nil {
		return st, fmt.Errorf("mop state: %w", err)
	}
	if err := checkMOP(st); err != nil {
		return st, fmt.Errorf("mop state: %w", err)
	}
	return st, nil
}

// encodeMOPFile is the content of mop.json: a JSON object of learned
// states by MOPKey, keys sorted.
func encodeMOPFile(states map[string]admission.MOPState) ([]byte, error) {
	for key, st := range states {
		if err := checkMOPKey(key); err != nil {
			return nil, fmt.Errorf("mop state %q: %w", key, err)
		}
		if err := checkMOP(st); err != nil {
			return nil, fmt.Errorf("mop state %q: %w", key, err)
		}
	}
	data, err := json.MarshalIndent(states, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(data, '\n'), nil
}

// decodeMOPFile parses mop.json and checks every key and state.
func decodeMOPFile(data []byte) (map[string]admission.MOPState, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, fmt.Errorf("learned states: %w", err)
	}
	out := make(map[string]admission.MOPState, len(raw))
	for key, v := range raw {
		if err := checkMOPKey(key); err != nil {
			return nil, fmt.Errorf("mop key %q: %w", key, err)
		}
		st, err := decodeMOP(v)
		if err != nil {
			return nil, fmt.Errorf("mop key %q: %w", key, err)
		}
		out[key] = st
	}
	return out, nil
}

// SaveMOP stores the given learned states, keyed by MOPKey, and syncs
// them to disk before returning: all states are written to a new file
// that replaces mop.json in one rename, so a save is all or nothing.
// States of backends not in the map are kept, so a backend removed and
// added again gets its learned rate back. A state with an invalid key or a
// non-finite or out-of-range number is skipped and reported in the
// returned error; the others are still saved. A provisional state (a rate
// moved by one memory sample, see admission.MOPState) is not saved and
// not an error: the state stored before it stays until a confirmed one
// replaces it.
//
// When the data directory cannot be written the error wraps
// ErrUnwritable; the states are kept in memory (LoadMOP returns them) and
// written by the next save that works. The failure is counted and logged
// by the store (see Health).
func (s *Store) SaveMOP(states map[string]admission.MOPState) error {
	if s.cfg.ReadOnly {
		return fmt.Errorf("save mop states to %s: store is read-only", s.cfg.Dir)
	}
	if err := s.checkOpen(); err != nil {
		return fmt.Errorf("save mop states to %s: %w", s.cfg.Dir, err)
	}
	var errs []error
	changed := make(map[string]admission.MOPState, len(states))
	s.mopMu.Lock()
	for key, st := range states {
		if err := checkMOPKey(key); err != nil {
			errs = append(errs, fmt.Errorf("save mop state %q: %w", key, err))
			continue
		}
		if err := checkMOP(st); err != nil {
			errs = append(errs, fmt.Errorf("save mop state %q: %w", key, err))
			continue
		}
		if st.Provisional {
			continue
		}
		s.mop[key] = st
		changed[key] = st
	}
	all := maps.Clone(s.mop)
	s.mopMu.Unlock()
	if s.rc != nil {
		// Format 3: queued for the store process, never waited on.
		if len(changed) > 0 {
			s.rc.queueMOP(changed)
		}
		return errors.Join(errs...)
	}
	if len(all) == 0 {
		return errors.Join(errs...)
	}
	data, err := encodeMOPFile(all)
	if err != nil { // checked above; cannot happen
		return errors.Join(append(errs, err)...)
	}
	if err := s.writeSmallFile(mopFile, "learned rates", data); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Save stores one backend's state; see SaveMOP.
func (s *Store) Save(key string, st admission.MOPState) error {
	return s.SaveMOP(map[string]admission.MOPState{key: st})
}

// LoadMOP returns every learned state keyed by MOPKey: those read at Open
// and those saved since. Call it at start, before traffic is admitted,
// and hand each state to the backend's (*admission.MOP).Import.
func (s *Store) LoadMOP() (map[string]admission.MOPState, error) {
	if err := s.checkOpen(); err != nil {
		return nil, fmt.Errorf("load mop states from %s: %w", s.cfg.Dir, err)
	}
	s.mopMu.Lock()
	defer s.mopMu.Unlock()
	return maps.Clone(s.mop), nil
}
