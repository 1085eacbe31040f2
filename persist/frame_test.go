package persist

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/sluicelb/sluice/admission"
)

// TestWriteFrameEncoding: golden bytes of a binary write message (a put,
// a deletion, a backend id too long left out), its round trip, and the
// JSON part when the request holds more than dialogs.
func TestWriteFrameEncoding(t *testing.T) {
	exp := time.Unix(0, 0x0102030405060708)
	req := &request{Op: opWrite, Now: time.Unix(0, 0x1112131415161718), HistoryRetention: 0x21222324,
		Dialogs: []DialogRecord{
			{Key: 0x1122334455667788, Expires: exp, ToTag: 0xaabbccdd, Src: 0xeeff, Backend: "p\x00s1"},
			{Key: 2, Backend: strings.Repeat("x", maxDialogBackend+1), Expires: exp}, // left out
			{Key: 1}, // a deletion
		}}
	buf, err := appendRequest([]byte("kept"), req)
	if err != nil {
		t.Fatal(err)
	}
	const golden = "6b657074" + // what buf held before
		"0000004d" + // frame length
		"01" + "1112131415161718" + "0000000021222324" + "00000000" + // version, now, retention, no JSON
		"00000002" + // records
		"1122334455667788" + "0102030405060708" + "aabbccdd" + "eeff" + "00" + "04" + "70007331" +
		"0000000000000001" + "0000000000000000" + "00000000" + "0000" + "00" + "00"
	if got := hex.EncodeToString(buf); got != golden {
		t.Fatalf("frame\n got %s\nwant %s", got, golden)
	}
	var fr frameReader
	var back request
	if err := fr.readRequest(bytes.NewReader(buf[4:]), &back); err != nil {
		t.Fatal(err)
	}
	if back.Op != opWrite || !back.Now.Equal(req.Now) || back.HistoryRetention != req.HistoryRetention || len(back.Dialogs) != 2 {
		t.Fatalf("decoded %+v", back)
	}
	for i, w := range []DialogRecord{req.Dialogs[0], req.Dialogs[2]} {
		g := back.Dialogs[i]
		if g.Key != w.Key || !g.Expires.Equal(w.Expires) || g.Expires.IsZero() != w.Expires.IsZero() ||
			g.ToTag != w.ToTag || g.Src != w.Src || g.Linger != w.Linger || g.Backend != w.Backend {
			t.Errorf("record %d: %+v, want %+v", i, g, w)
		}
	}
	if !weakDialog(back.Dialogs[1]) {
		t.Error("a deletion decodes as a record that replaces a confirmed dialog")
	}

	// With more than dialogs, the rest goes as JSON in the same message.
	full := &request{Op: opWrite, ClusterNodes: 3, Events: []seqEvent{{Event: admission.Event{Kind: "k", Message: "m", Time: exp}, Seq: 9}},
		History: []HistorySample{{Time: exp, Resolution: "1s", Data: []byte{1, 2}}}, DeleteDialogs: []uint64{4},
		MOP: map[string]admission.MOPState{"sip/a:1": {AllowedRate: 5}}, Overrides: &[]Override{},
		Dialogs: []DialogRecord{{Key: 7, Expires: exp, Linger: true, Backend: "b"}}}
	buf, err = appendRequest(nil, full)
	if err != nil {
		t.Fatal(err)
	}
	back = request{}
	if err := fr.decodeRequest(buf[4:], &back); err != nil {
		t.Fatal(err)
	}
	if !back.Now.IsZero() || back.ClusterNodes != 3 || len(back.Events) != 1 || back.Events[0].Seq != 9 ||
		len(back.History) != 1 || !bytes.Equal(back.History[0].Data, []byte{1, 2}) || len(back.DeleteDialogs) != 1 ||
		back.MOP["sip/a:1"].AllowedRate != 5 || back.Overrides == nil || len(back.Dialogs) != 1 || !back.Dialogs[0].Linger {
		t.Fatalf("decoded %+v", back)
	}

	// Other operations go as JSON.
	buf, err = appendRequest(nil, &request{Op: opPing})
	if err != nil || string(buf[4:]) != `{"op":"ping"}` || binary.BigEndian.Uint32(buf) != uint32(len(buf)-4) {
		t.Fatalf("ping frame %q, %v", buf, err)
	}
}

// TestWriteFrameBad: messages of another version, cut short, with bytes
// after their last record, or claiming more records than they hold are
// errors.
func TestWriteFrameBad(t *testing.T) {
	good, err := appendRequest(nil, &request{Op: opWrite, Dialogs: []DialogRecord{{Key: 1, Backend: "ab", Expires: time.Unix(5, 0)}}})
	if err != nil {
		t.Fatal(err)
	}
	msg := good[4:]
	head := writeFrameHead + 4
	withCount := func(n uint32) []byte {
		b := bytes.Clone(msg)
		binary.BigEndian.PutUint32(b[writeFrameHead:], n)
		return b
	}
	withIDLen := func(n byte) []byte {
		b := bytes.Clone(msg)
		b[len(b)-3] = n
		return b
	}
	withJSON := func(n uint32) []byte {
		b := bytes.Clone(msg)
		binary.BigEndian.PutUint32(b[writeFrameHead-4:], n)
		return b
	}
	cases := []struct {
		name string
		msg  []byte
		want string
	}{
		{"empty", nil, "unknown format"},
		{"other version", append([]byte{2}, msg[1:]...), "unknown format 2"},
		{"head cut short", msg[:head-1], "cut short"},
		{"record cut short", msg[:len(msg)-3], "dialog records in"},
		{"backend id cut short", withIDLen(10), "record cut short"},
		{"bytes after", append(bytes.Clone(msg), 0), "after the last"},
		{"more records than bytes", withCount(1 << 30), "dialog records in"},
		{"second record missing", withCount(2), "dialog records in"},
		{"JSON longer than the message", withJSON(1 << 31), "JSON part cut short"},
		{"JSON part not JSON", withJSON(3), "store write message"},
		{"now out of range", append([]byte{1, 0xff}, msg[2:]...), "out of range"},
	}
	for _, c := range cases {
		var fr frameReader
		var req request
		err := fr.decodeRequest(c.msg, &req)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error with %q", c.name, err, c.want)
		}
	}
	// A frame over maxFrame is refused before its body is read.
	var fr frameReader
	var hdr [4]byte
	binary.BigEndian.PutUint32(hdr[:], maxFrame+1)
	if _, err := fr.read(bytes.NewReader(hdr[:])); err == nil || fr.buf != nil {
		t.Fatalf("frame over maxFrame: %v, buffer of %d", err, cap(fr.buf))
	}
	// One cut short is an unexpected EOF, not a clean end.
	if _, err := fr.read(bytes.NewReader(good[:len(good)-1])); err != io.ErrUnexpectedEOF {
		t.Fatalf("frame cut short: %v", err)
	}
}

// TestFrameReaderReuse: the reader's buffers and interned ids are reused
// across messages, so steady decoding does not allocate per record.
func TestFrameReaderReuse(t *testing.T) {
	recs := make([]DialogRecord, 500)
	for i := range recs {
		recs[i] = DialogRecord{Key: uint64(i + 1), Backend: "pool\x00backend-" + string(rune('a'+i%3)), ToTag: 1, Expires: time.Unix(1e9, 0)}
	}
	buf, err := appendRequest(nil, &request{Op: opWrite, Dialogs: recs})
	if err != nil {
		t.Fatal(err)
	}
	var fr frameReader
	var req request
	r := bytes.NewReader(buf)
	decode := func() {
		r.Reset(buf)
		req = request{}
		if err := fr.readRequest(r, &req); err != nil || len(req.Dialogs) != len(recs) {
			t.Fatalf("%d records, %v", len(req.Dialogs), err)
		}
	}
	decode()
	if n := testing.AllocsPerRun(20, decode); n > 0 {
		t.Fatalf("%.0f allocations per message of %d records", n, len(recs))
	}
	if len(fr.ids.m) != 3 || req.Dialogs[499].Backend != recs[499].Backend {
		t.Fatalf("interned %d ids; last record %+v", len(fr.ids.m), req.Dialogs[499])
	}
}

// FuzzDecodeRequest: hostile bytes on the store process's socket either
// fail to decode or decode to records that encode back to a message that
// decodes the same; nothing panics, and the records never outnumber what
// the message's length allows.
func FuzzDecodeRequest(f *testing.F) {
	exp := time.Unix(0, 0x0102030405060708)
	for _, req := range []*request{
		{Op: opWrite, Now: exp, Dialogs: []DialogRecord{{Key: 1, Backend: "p\x00s1", ToTag: 3, Expires: exp}, {Key: 2}}},
		{Op: opWrite, ClusterNodes: 2, Dialogs: []DialogRecord{{Key: 1, Linger: true, Expires: exp}}},
		{Op: opWrite},
		{Op: opPing},
	} {
		b, err := appendRequest(nil, req)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b[4:])
	}
	f.Add([]byte{1})
	f.Add([]byte{1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, '{', '}', 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte(`{"op":"write","dialogs":[{"k":1}]}`))
	f.Fuzz(func(t *testing.T, msg []byte) {
		var fr frameReader
		var req request
		if err := fr.decodeRequest(msg, &req); err != nil {
			return
		}
		if len(msg) > 0 && msg[0] == '{' {
			return // JSON: encoding/json's own
		}
		if len(req.Dialogs)*journalRecMin > len(msg) {
			t.Fatalf("%d records from %d bytes", len(req.Dialogs), len(msg))
		}
		for _, d := range req.Dialogs {
			if len(d.Backend) > maxDialogBackend {
				t.Fatalf("backend id of %d bytes", len(d.Backend))
			}
		}
		enc, err := appendRequest(nil, &req)
		if err != nil {
			t.Fatalf("decoded %+v does not encode: %v", req, err)
		}
		var fr2 frameReader
		var req2 request
		if err := fr2.decodeRequest(enc[4:], &req2); err != nil {
			t.Fatalf("re-encoded message does not decode: %v", err)
		}
		if len(req2.Dialogs) != len(req.Dialogs) || !req2.Now.Equal(req.Now) || req2.HistoryRetention != req.HistoryRetention {
			t.Fatalf("round trip of %+v gave %+v", req, req2)
		}
		for i := range req.Dialogs {
			a, b := req.Dialogs[i], req2.Dialogs[i]
			if a.Key != b.Key || !a.Expires.Equal(b.Expires) || a.ToTag != b.ToTag || a.Src != b.Src ||
				a.Linger != b.Linger || a.Backend != b.Backend {
				t.Fatalf("record %d: %+v gave %+v", i, a, b)
			}
		}
	})
}

// BenchmarkWriteFrame is the balancer's encoding of one write of 1000
// dialog records (a 100 ms batch at 10,000 changes/s) into a reused
// buffer, and the store process's decoding of it; ns/op is per batch.
func BenchmarkWriteFrame(b *testing.B) {
	exp := time.Now().Add(time.Hour)
	recs := make([]DialogRecord, 1000)
	for j := range recs {
		recs[j] = DialogRecord{Key: uint64(j+1) * 0x9e3779b97f4a7c15, Backend: "default\x00sip/10.0.0.7:5060", ToTag: uint32(j), Src: 7, Expires: exp}
	}
	req := &request{Op: opWrite, Dialogs: recs, Now: time.Now(), HistoryRetention: DefaultHistoryRetention}
	b.Run("encode", func(b *testing.B) {
		var buf []byte
		b.ReportAllocs()
		for range b.N {
			buf, _ = appendRequest(buf[:0], req)
		}
		b.SetBytes(int64(len(buf)))
	})
	b.Run("decode", func(b *testing.B) {
		buf, _ := appendRequest(nil, req)
		var fr frameReader
		r := bytes.NewReader(buf)
		b.ReportAllocs()
		for range b.N {
			r.Reset(buf)
			var back request
			if err := fr.readRequest(r, &back); err != nil {
				b.Fatal(err)
			}
		}
	})
}
