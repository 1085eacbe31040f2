package persist

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/dgraph-io/badger/v4"

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
func checkMOP(st admission.MOPState) error {
	switch {
	case st.Phase != admission.Discovery && st.Phase != admission.Learned:
		return fmt.Errorf("unknown phase %d", st.Phase)
	case !finite(st.LearnedRate) || st.LearnedRate < 0:
		return fmt.Errorf("learned rate %g is not a finite non-negative number", st.LearnedRate)
	case !finite(st.AllowedRate) || st.AllowedRate < 0:
		return fmt.Errorf("allowed rate %g is not a finite non-negative number", st.AllowedRate)
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

// SaveMOP stores the given learned states, keyed by MOPKey, in one
// transaction and syncs them to disk before returning. States of backends
// not in the map are kept, so a backend removed and added again gets its
// learned rate back. A state with an invalid key or a non-finite number is
// skipped and reported in the returned error; the others are still saved.
func (s *Store) SaveMOP(states map[string]admission.MOPState) error {
	if s.cfg.ReadOnly {
		return fmt.Errorf("save mop states to %s: store is read-only", s.cfg.Dir)
	}
	release, err := s.acquire()
	if err != nil {
		return fmt.Errorf("save mop states to %s: %w", s.cfg.Dir, err)
	}
	defer release()
	var errs []error
	type rec struct{ k, v []byte }
	recs := make([]rec, 0, len(states))
	for key, st := range states {
		if err := checkMOPKey(key); err != nil {
			errs = append(errs, fmt.Errorf("save mop state %q: %w", key, err))
			continue
		}
		v, err := encodeMOP(st)
		if err != nil {
			errs = append(errs, fmt.Errorf("save mop state %q: %w", key, err))
			continue
		}
		recs = append(recs, rec{append(bytes.Clone(mopPrefix), key...), v})
	}
	if len(recs) > 0 {
		err := s.db.Update(func(txn *badger.Txn) error {
			for _, r := range recs {
				if err := txn.Set(r.k, r.v); err != nil {
					return err
				}
			}
			return nil
		})
		if err == nil {
			err = s.db.Sync()
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("save mop states to %s: %w", s.cfg.Dir, err))
		}
	}
	return errors.Join(errs...)
}

// Save stores one backend's state; see SaveMOP.
func (s *Store) Save(key string, st admission.MOPState) error {
	return s.SaveMOP(map[string]admission.MOPState{key: st})
}

// LoadMOP returns every stored learned state keyed by MOPKey. Call it at
// start, before traffic is admitted, and hand each state to the backend's
// (*admission.MOP).Import. A record that does not decode gives an error
// wrapping ErrCorrupt.
func (s *Store) LoadMOP() (map[string]admission.MOPState, error) {
	release, err := s.acquire()
	if err != nil {
		return nil, fmt.Errorf("load mop states from %s: %w", s.cfg.Dir, err)
	}
	defer release()
	out := make(map[string]admission.MOPState)
	err = s.db.View(func(txn *badger.Txn) error {
		opts := badger.DefaultIteratorOptions
		opts.Prefix = mopPrefix
		it := txn.NewIterator(opts)
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			item := it.Item()
			key, err := parseMOPKey(item.Key())
			if err != nil {
				return fmt.Errorf("%w: %w", ErrCorrupt, err)
			}
			var st admission.MOPState
			var derr error
			if err := item.Value(func(v []byte) error {
				st, derr = decodeMOP(v)
				return nil
			}); err != nil {
				return err
			}
			if derr != nil {
				return fmt.Errorf("%w: key %q: %w", ErrCorrupt, item.Key(), derr)
			}
			out[key] = st
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("load mop states from %s: %w", s.cfg.Dir, err)
	}
	return out, nil
}
