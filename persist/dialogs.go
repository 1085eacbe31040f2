package persist

import (
	"encoding/binary"
	"errors"
	"math"
	"time"
)

// DialogRecord is one entry of the SIP dialog table as stored, so that
// in-dialog requests of calls established before a restart still reach
// their backend. Key is the table's hash of Call-ID and From-tag; the
// other fields are what the table holds, with the monotonic deadline
// turned into a wall time (Expires).
type DialogRecord struct {
	Key     uint64    `json:"k"`
	Backend string    `json:"b"`
	ToTag   uint32    `json:"t,omitempty"`
	Src     uint16    `json:"s,omitempty"`
	Linger  bool      `json:"l,omitempty"`
	Expires time.Time `json:"e"`
}

// maxDialogBackend is the longest backend id stored with a dialog.
const maxDialogBackend = 255

// dialogKey is "d/" and the big-endian key: 10 bytes.
func dialogKey(k uint64) []byte {
	return appendDialogKey(make([]byte, 0, len(dialogPrefix)+8), k)
}

// appendDialogKey appends the key of dialog k to b.
func appendDialogKey(b []byte, k uint64) []byte {
	return binary.BigEndian.AppendUint64(append(b, dialogPrefix...), k)
}

// encodeDialog is the stored value: expiry (Unix ns), To-tag hash,
// source hash, linger flag, then the backend id; 15 bytes plus the id.
func encodeDialog(d DialogRecord) []byte {
	return appendDialog(make([]byte, 0, 15+len(d.Backend)), d)
}

// appendDialog appends the stored value of d to b.
func appendDialog(b []byte, d DialogRecord) []byte {
	b = binary.BigEndian.AppendUint64(b, uint64(unixNanos(d.Expires)))
	b = binary.BigEndian.AppendUint32(b, d.ToTag)
	b = binary.BigEndian.AppendUint16(b, d.Src)
	var l byte
	if d.Linger {
		l = 1
	}
	b = append(b, l)
	return append(b, d.Backend...)
}

func decodeDialog(key, v []byte) (DialogRecord, error) {
	if len(key) != len(dialogPrefix)+8 || len(v) < 15 || len(v) > 15+maxDialogBackend {
		return DialogRecord{}, errors.New("dialog record: bad length")
	}
	ns := binary.BigEndian.Uint64(v)
	if ns > math.MaxInt64 {
		return DialogRecord{}, errors.New("dialog record: expiry out of range")
	}
	return DialogRecord{
		Key:     binary.BigEndian.Uint64(key[len(dialogPrefix):]),
		Expires: time.Unix(0, int64(ns)),
		ToTag:   binary.BigEndian.Uint32(v[8:]),
		Src:     binary.BigEndian.Uint16(v[12:]),
		Linger:  v[14] == 1,
		Backend: string(v[15:]),
	}, nil
}

// HistorySample is one sample of the dashboard's history, kept opaque
// here (the admin package encodes it): Time orders and ages it out,
// Resolution names its series ("1s", "10s") so that several resolutions
// share the store.
type HistorySample struct {
	Time       time.Time `json:"t"`
	Resolution string    `json:"r"`
	Data       []byte    `json:"d"`
	// Keep, when positive and shorter than Config.HistoryRetention, is
	// how long this sample is kept instead (the dashboard's 1 s samples:
	// 15 minutes).
	Keep time.Duration `json:"k,omitempty"`
}

// maxHistorySample bounds one sample's data.
const maxHistorySample = 64 << 10
