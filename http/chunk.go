package http

import "errors"

// chunkScan finds the end of a chunked body (RFC 9112 §7.1) in bytes that
// arrive in pieces, without changing them: the loop engine relays chunked
// answers as they are and only needs to know where they end.
//
// With strict set (request bodies), every line must end in CRLF, a chunk
// size is followed by CRLF or ';', extensions hold no control bytes and
// there is no trailer field: the lenient forms are where parsers disagree
// on where a chunked body ends.
type chunkScan struct {
	st     uint8
	size   int64 // bytes of chunk data still to skip, or the size being read
	any    bool  // a size digit was read
	strict bool
}

// States of chunkScan.
const (
	csSize      = iota // chunk size digits
	csExt              // chunk extension, up to LF
	csSizeLF           // CR seen after the size line
	csData             // chunk data
	csDataCR           // CR after the data
	csDataLF           // LF after the data
	csLineStart        // start of a trailer line (or of the final empty line)
	csTrailer          // inside a trailer field line, up to LF
	csEndLF            // CR of the final empty line seen
	csTrailerLF        // CR at the end of a trailer line seen (strict)
)

// ctl reports whether b is a control byte other than HTAB.
func ctl(b byte) bool { return (b < 0x20 && b != '\t') || b == 0x7f }

var errBadChunk = errors.New("malformed chunked body")

// feed scans p. It returns how many bytes of p belong to the body and
// whether the body ends within them (then n is where it ends).
func (c *chunkScan) feed(p []byte) (n int, done bool, err error) {
	for i := 0; i < len(p); i++ {
		b := p[i]
		switch c.st {
		case csSize:
			switch {
			case b >= '0' && b <= '9', b >= 'a' && b <= 'f', b >= 'A' && b <= 'F':
				if c.size > 1<<40 {
					return i, false, errBadChunk
				}
				c.size = c.size<<4 | int64(unhex(b))
				c.any = true
			case !c.any:
				return i, false, errBadChunk
			case b == ';':
				c.st = csExt
			case (b == ' ' || b == '\t') && !c.strict:
				c.st = csExt
			case b == '\r':
				c.st = csSizeLF
			case b == '\n' && !c.strict:
				c.endSize()
			default:
				return i, false, errBadChunk
			}
		case csExt:
			switch {
			case c.strict && b == '\r':
				c.st = csSizeLF
			case c.strict && ctl(b):
				return i, false, errBadChunk
			case b == '\n':
				c.endSize()
			}
		case csSizeLF:
			if b != '\n' {
				return i, false, errBadChunk
			}
			c.endSize()
		case csData:
			k := int64(len(p) - i)
			if k > c.size {
				k = c.size
			}
			c.size -= k
			i += int(k) - 1
			if c.size == 0 {
				c.st = csDataCR
			}
		case csDataCR:
			switch b {
			case '\r':
				c.st = csDataLF
			case '\n':
				if c.strict {
					return i, false, errBadChunk
				}
				c.st = csSize
			default:
				return i, false, errBadChunk
			}
		case csDataLF:
			if b != '\n' {
				return i, false, errBadChunk
			}
			c.st = csSize
		case csLineStart:
			switch b {
			case '\r':
				c.st = csEndLF
			case '\n':
				if c.strict {
					return i, false, errBadChunk
				}
				return i + 1, true, nil
			default:
				if c.strict {
					// Request trailers are refused: a field that arrives
					// after the head and body were sent on cannot be
					// checked as a head field is (Forwarded, Upgrade, ...).
					return i, false, errBadChunk
				}
				c.st = csTrailer
			}
		case csTrailer:
			switch {
			case c.strict && b == '\r':
				c.st = csTrailerLF
			case c.strict && ctl(b):
				return i, false, errBadChunk
			case b == '\n':
				c.st = csLineStart
			}
		case csTrailerLF:
			if b != '\n' {
				return i, false, errBadChunk
			}
			c.st = csLineStart
		case csEndLF:
			if b != '\n' {
				return i, false, errBadChunk
			}
			return i + 1, true, nil
		}
	}
	return len(p), false, nil
}

func (c *chunkScan) endSize() {
	if c.size == 0 {
		c.st = csLineStart
	} else {
		c.st = csData
	}
	c.any = false
}

func unhex(b byte) byte {
	switch {
	case b <= '9':
		return b - '0'
	case b >= 'a':
		return b - 'a' + 10
	}
	return b - 'A' + 10
}
