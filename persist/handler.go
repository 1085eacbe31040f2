package persist

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/sluicelb/sluice/admission"
)

// Limits of the limit parameter of GET /events.
const (
	DefaultEventsLimit = 100
	MaxEventsLimit     = 10_000
)

// EventsPage is the JSON body of GET /events.
type EventsPage struct {
	Events []admission.Event `json:"events"`
	// More is true when the limit cut the answer short. With since, ask
	// again with since set to the time of the last event (since is
	// inclusive, so that event comes again); without since, older events
	// were left out.
	More bool `json:"more"`
	// Omitted is, with order=newest and since, how many events at or after
	// since were left out (the oldest of them); 0 otherwise.
	Omitted int `json:"omitted"`
	// Dropped is how many events this process could not store.
	Dropped uint64 `json:"dropped"`
}

// ParseSince parses a since value: an RFC 3339 time, or a positive Go
// duration meaning that long before now ("15m"). Empty gives the zero time.
func ParseSince(v string, now time.Time) (time.Time, error) {
	if v == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
		return t, nil
	}
	if d, err := time.ParseDuration(v); err == nil && d > 0 {
		return now.Add(-d), nil
	}
	return time.Time{}, fmt.Errorf("since %q: want an RFC 3339 time such as 2026-11-29T15:04:05Z or a duration such as 15m", v)
}

// ParseLimit parses a limit value: empty gives DefaultEventsLimit, else an
// integer in [1, MaxEventsLimit].
func ParseLimit(v string) (int, error) {
	if v == "" {
		return DefaultEventsLimit, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > MaxEventsLimit {
		return 0, fmt.Errorf("limit %q: want an integer from 1 to %d", v, MaxEventsLimit)
	}
	return n, nil
}

// EventsHandler serves GET /events?since=RFC3339&limit=N[&type=KIND][&subject=S]
// as an EventsPage (type and subject select events of that kind and
// subject, read from the store's index):
// up to limit events at or after since, oldest first. Without since, or
// with order=newest, it returns the newest limit events (at or after
// since; still oldest first), and with since says how many it left out
// (Omitted): the dashboard asks for the newest of its window. A bad parameter
// gets 400 with a one-line message, a method other than GET or HEAD 405.
// It reads from the store on the caller's goroutine: mount it on the admin
// listener, never on a request path.
func (s *Store) EventsHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		q := r.URL.Query()
		since, err := ParseSince(q.Get("since"), s.cfg.Now())
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		limit, err := ParseLimit(q.Get("limit"))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		newest := false
		switch o := q.Get("order"); o {
		case "", "oldest":
		case "newest":
			newest = true
		default:
			http.Error(w, fmt.Sprintf("order %q: want oldest (the default) or newest", o), http.StatusBadRequest)
			return
		}
		kind, subject := q.Get("type"), q.Get("subject")
		if len(kind) > maxIndexedLabel || len(subject) > maxIndexedLabel {
			http.Error(w, fmt.Sprintf("type or subject longer than %d bytes", maxIndexedLabel), http.StatusBadRequest)
			return
		}
		// Read one more than asked to know whether there is more.
		var evs []admission.Event
		var more bool
		omitted := 0
		if kind != "" || subject != "" {
			// By type or subject: an index range, not the whole log.
			evs, more, omitted, err = s.Query(EventQuery{Since: since, Kind: kind, Subject: subject,
				Limit: limit + 1, Newest: newest || q.Get("since") == ""})
			if omitted > 0 || len(evs) > limit {
				more = true
			}
			if len(evs) > limit && newest {
				omitted++ // the one more read is left out below
			}
			if !newest || q.Get("since") == "" {
				omitted = 0 // as without type: counted with order=newest&since only
			}
		} else if newest && q.Get("since") != "" {
			evs, omitted, err = s.Newest(since, limit)
		} else if q.Get("since") == "" {
			evs, err = s.Tail(limit + 1)
		} else {
			evs, err = s.Events(since, limit+1)
		}
		more = more || len(evs) > limit || omitted > 0
		if len(evs) > limit && (q.Get("since") == "" || newest) {
			evs = evs[1:]
		} else if len(evs) > limit {
			evs = evs[:limit]
		}
		if err != nil {
			code := http.StatusInternalServerError
			if errors.Is(err, ErrClosed) {
				code = http.StatusServiceUnavailable
			}
			s.log.Warn("serving events failed", "err", err)
			http.Error(w, "reading the event log failed", code)
			return
		}
		page := EventsPage{Events: evs, More: more, Omitted: omitted, Dropped: s.EventsDropped()}
		if page.Events == nil {
			page.Events = []admission.Event{}
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		if err := enc.Encode(page); err != nil {
			s.log.Debug("writing events response failed", "err", err)
		}
	})
}
