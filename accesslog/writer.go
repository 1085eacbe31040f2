package accesslog

// The writer: the one goroutine that takes records from the rings,
// formats the sampled ones and hands them to their destination and to the
// sinks that want them. It is the only goroutine that writes to a
// destination, so a slow destination stalls it alone: the rings fill and
// the front ends' records are dropped and counted.

import "time"

// writerTick is how often the writer looks at the rings when no record
// woke it: how late a line may reach its destination at low load.
const writerTick = 20 * time.Millisecond

// batch is how many records the writer takes from one ring before it
// looks at the other, so a flood of one protocol does not starve the other.
const batch = 256

func (l *Logger) run() {
	defer close(l.done)
	var line []byte
	tick := time.NewTicker(writerTick)
	defer tick.Stop()
	for {
		if l.reopen.Swap(false) {
			for _, d := range l.dests {
				if err := d.reopen(); err != nil {
					l.errs.Add(1)
				}
			}
		}
		n := 0
		for {
			a := l.drainHTTP(&line)
			b := l.drainSIP(&line)
			n += a + b
			if a+b == 0 {
				break
			}
		}
		if n > 0 {
			l.flush()
		}
		select {
		case <-l.wake:
		case <-tick.C:
		case <-l.quit:
			for l.drainHTTP(&line)+l.drainSIP(&line) > 0 {
			}
			l.flush()
			return
		}
	}
}

func (l *Logger) flush() {
	for _, d := range l.dests {
		if err := d.flush(); err != nil {
			l.errs.Add(1)
		}
	}
}

func (l *Logger) drainHTTP(line *[]byte) int {
	n := 0
	for ; n < batch; n++ {
		s := l.http.take()
		if s == nil {
			break
		}
		var out []byte
		if s.logged {
			*line = l.formatHTTP((*line)[:0], &s.rec)
			out = *line
			if err := l.dest[HTTP].add(out, HTTP, s.rec.Start); err != nil {
				l.errs.Add(1)
			} else {
				l.written[HTTP].Add(1)
			}
		}
		for i, sk := range l.opts.Sinks {
			if i < 64 && s.sinks&(1<<i) != 0 {
				sk.WriteHTTP(&s.rec, out)
			}
		}
		l.http.release(s)
	}
	return n
}

func (l *Logger) drainSIP(line *[]byte) int {
	n := 0
	for ; n < batch; n++ {
		s := l.sip.take()
		if s == nil {
			break
		}
		var out []byte
		if s.logged {
			*line = l.formatSIP((*line)[:0], &s.rec)
			out = *line
			if err := l.dest[SIP].add(out, SIP, s.rec.Start); err != nil {
				l.errs.Add(1)
			} else {
				l.written[SIP].Add(1)
			}
		}
		for i, sk := range l.opts.Sinks {
			if i < 64 && s.sinks&(1<<i) != 0 {
				sk.WriteSIP(&s.rec, out)
			}
		}
		l.sip.release(s)
	}
	return n
}
