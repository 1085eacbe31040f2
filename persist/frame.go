package persist

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"time"
)

// A write request (opWrite) does not go as JSON: under SIP load it is
// mostly dialog records, some five changes a call, and encoding them as
// JSON (a time.Time each) cost more of the balancer's CPU than the rest
// of the write-through. It goes as a binary message in the same frame (a
// 4-byte big-endian length, then the message); a JSON message starts
// with '{', a binary one with its version byte:
//
//	version   1 byte   writeFrameVersion
//	now       8 bytes  request.Now, Unix ns (0: not set)
//	retention 8 bytes  request.HistoryRetention, ns
//	jsonLen   4 bytes  length of the JSON part (0: none)
//	json      jsonLen  the rest of the request (MOP, overrides, events,
//	                   history, ...) as JSON, without its dialogs
//	count     4 bytes  dialog records that follow
//	records            each as a journal record: key 8, expiry (Unix ns,
//	                   0: a deletion) 8, To-tag hash 4, source hash 2,
//	                   linger 1, backend id length 1, backend id
//
// all integers big-endian, the message ending with the last record. The
// balancer and the store process are the same binary; the version byte
// makes a mismatch (or a stream out of step) an error, not garbage. The
// balancer encodes into a buffer it reuses and writes each message with
// one write; the store process reads it into a buffer it reuses and
// decodes the records into a slice it reuses, backend ids interned, so
// neither allocates per record.

// writeFrameVersion is the first byte of a binary write message.
const writeFrameVersion = 1

// writeFrameHead is the message before its JSON part: version, now,
// history retention, JSON length.
const writeFrameHead = 1 + 8 + 8 + 4

// maxKeptBuf is the largest read or write buffer kept for the next
// message; a larger one (a migration's events) is let go.
const maxKeptBuf = 1 << 20

// maxKeptRecs is the largest slice of dialog records a frameReader keeps
// for the next message.
const maxKeptRecs = 1 << 14

// maxInterned bounds the backend ids a frameReader keeps.
const maxInterned = 1024

// errTooLarge is a message over maxFrame; nothing was sent.
var errTooLarge = errors.New("store message too large")

// appendDialogRec appends d as a journal record (expiry 0 for a zero
// Expires). The caller leaves out a backend id over maxDialogBackend.
func appendDialogRec(b []byte, d DialogRecord) []byte {
	var exp uint64
	if !d.Expires.IsZero() {
		exp = uint64(unixNanos(d.Expires))
	}
	b = binary.BigEndian.AppendUint64(b, d.Key)
	b = binary.BigEndian.AppendUint64(b, exp)
	b = binary.BigEndian.AppendUint32(b, d.ToTag)
	b = binary.BigEndian.AppendUint16(b, d.Src)
	var l byte
	if d.Linger {
		l = 1
	}
	b = append(b, l, byte(len(d.Backend)))
	return append(b, d.Backend...)
}

// appendRequest appends req's frame (length, message) to buf: a binary
// message for opWrite, JSON for the others. Dialog records with a backend
// id over maxDialogBackend are left out (the store never keeps one).
func appendRequest(buf []byte, req *request) ([]byte, error) {
	if req.Op != opWrite {
		return appendJSONFrame(buf, req)
	}
	start := len(buf)
	buf = append(buf, 0, 0, 0, 0, writeFrameVersion)
	var now uint64
	if !req.Now.IsZero() {
		now = uint64(unixNanos(req.Now))
	}
	buf = binary.BigEndian.AppendUint64(buf, now)
	buf = binary.BigEndian.AppendUint64(buf, uint64(req.HistoryRetention))
	jl := len(buf)
	buf = append(buf, 0, 0, 0, 0)
	if !req.emptyWrite() {
		data, err := json.Marshal(&request{MOP: req.MOP, Overrides: req.Overrides, ClusterNodes: req.ClusterNodes,
			Events: req.Events, History: req.History, DeleteDialogs: req.DeleteDialogs})
		if err != nil {
			return buf[:start], err
		}
		buf = append(buf, data...)
		binary.BigEndian.PutUint32(buf[jl:], uint32(len(data)))
	}
	cl := len(buf)
	buf = append(buf, 0, 0, 0, 0)
	n := 0
	for i := range req.Dialogs {
		if len(req.Dialogs[i].Backend) > maxDialogBackend {
			continue
		}
		buf = appendDialogRec(buf, req.Dialogs[i])
		n++
	}
	binary.BigEndian.PutUint32(buf[cl:], uint32(n))
	return finishFrame(buf, start)
}

// emptyWrite reports whether a write request holds nothing but dialogs
// and the fields of the binary message's head.
func (req *request) emptyWrite() bool {
	return len(req.MOP) == 0 && req.Overrides == nil && req.ClusterNodes == 0 && len(req.Events) == 0 &&
		len(req.History) == 0 && len(req.DeleteDialogs) == 0
}

// appendJSONFrame appends v's frame, a JSON message, to buf.
func appendJSONFrame(buf []byte, v any) ([]byte, error) {
	data, err := json.Marshal(v)
	if err != nil {
		return buf, err
	}
	start := len(buf)
	buf = append(buf, 0, 0, 0, 0)
	return finishFrame(append(buf, data...), start)
}

// finishFrame writes the length of the message that starts at
// buf[start+4:], or takes it back when it is over maxFrame.
func finishFrame(buf []byte, start int) ([]byte, error) {
	n := len(buf) - start - 4
	if n > maxFrame {
		return buf[:start], fmt.Errorf("%w: %d bytes, more than %d", errTooLarge, n, maxFrame)
	}
	binary.BigEndian.PutUint32(buf[start:], uint32(n))
	return buf, nil
}

// frameReader reads frames with a buffer it reuses, and decodes requests
// into dialog records it reuses. Not safe for concurrent use.
type frameReader struct {
	hdr  [4]byte
	buf  []byte
	recs []DialogRecord
	ids  idInterner
}

// read returns the next frame's message, valid until the next read.
func (fr *frameReader) read(r io.Reader) ([]byte, error) {
	if _, err := io.ReadFull(r, fr.hdr[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(fr.hdr[:])
	if n > maxFrame {
		return nil, fmt.Errorf("store message of %d bytes: more than %d", n, maxFrame)
	}
	if cap(fr.buf) < int(n) || cap(fr.buf) > maxKeptBuf {
		fr.buf = make([]byte, n)
	}
	data := fr.buf[:n]
	if _, err := io.ReadFull(r, data); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	return data, nil
}

// readRequest reads the next request into req. Its Dialogs are fr's,
// valid until the next call.
func (fr *frameReader) readRequest(r io.Reader, req *request) error {
	data, err := fr.read(r)
	if err != nil {
		return err
	}
	return fr.decodeRequest(data, req)
}

// decodeRequest decodes one message, JSON or binary. A binary message
// of another version, or one that does not end where its records do, is
// an error; nothing in it allocates more than its length allows.
func (fr *frameReader) decodeRequest(data []byte, req *request) error {
	if len(data) > 0 && data[0] == '{' {
		return json.Unmarshal(data, req)
	}
	if len(data) == 0 || data[0] != writeFrameVersion {
		v := -1
		if len(data) > 0 {
			v = int(data[0])
		}
		return fmt.Errorf("store message of unknown format %d (want %d or JSON): balancer and store process differ", v, writeFrameVersion)
	}
	if len(data) < writeFrameHead+4 {
		return errors.New("store write message cut short")
	}
	now := binary.BigEndian.Uint64(data[1:])
	if now > math.MaxInt64 {
		return errors.New("store write message: time out of range")
	}
	ret := int64(binary.BigEndian.Uint64(data[9:]))
	jl := binary.BigEndian.Uint32(data[17:])
	p := data[writeFrameHead:]
	if uint64(jl)+4 > uint64(len(p)) {
		return errors.New("store write message: JSON part cut short")
	}
	if jl > 0 {
		if err := json.Unmarshal(p[:jl], req); err != nil {
			return fmt.Errorf("store write message: %w", err)
		}
	}
	req.Op = opWrite
	req.HistoryRetention = time.Duration(ret)
	req.Now = time.Time{}
	if now != 0 {
		req.Now = time.Unix(0, int64(now))
	}
	p = p[jl:]
	count := binary.BigEndian.Uint32(p)
	p = p[4:]
	if uint64(count) > uint64(len(p)/journalRecMin) {
		return fmt.Errorf("store write message: %d dialog records in %d bytes", count, len(p))
	}
	recs := fr.recs[:0]
	if cap(recs) < int(count) {
		recs = make([]DialogRecord, 0, count)
	}
	for range count {
		if len(p) < journalRecMin || len(p) < journalRecMin+int(p[journalRecMin-1]) {
			return errors.New("store write message: dialog record cut short")
		}
		n := int(p[journalRecMin-1])
		exp := binary.BigEndian.Uint64(p[8:])
		if exp > math.MaxInt64 {
			return errors.New("store write message: dialog expiry out of range")
		}
		d := DialogRecord{
			Key:     binary.BigEndian.Uint64(p),
			ToTag:   binary.BigEndian.Uint32(p[16:]),
			Src:     binary.BigEndian.Uint16(p[20:]),
			Linger:  p[22] == 1,
			Backend: fr.ids.string(p[journalRecMin : journalRecMin+n]),
		}
		if exp != 0 {
			d.Expires = time.Unix(0, int64(exp))
		}
		recs = append(recs, d)
		p = p[journalRecMin+n:]
	}
	if len(p) != 0 {
		return fmt.Errorf("store write message: %d bytes after the last dialog record", len(p))
	}
	// Keep the slice for the next message unless one message made it
	// large; the records' strings are interned, never the buffer's.
	if cap(recs) <= maxKeptRecs {
		fr.recs = recs
	} else {
		fr.recs = nil
	}
	req.Dialogs = recs
	return nil
}
