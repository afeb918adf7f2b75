package postgres

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"

	"github.com/google/uuid"
)

// errReplan says that a line's decoded stream or version is not what the
// prescan read, so the batch's statement before its COPY was run on the
// wrong plan: the batch is rolled back and written again, planned from its
// decoded events.
var errReplan = errors.New("a line's stream or version differs from its prescan")

// importCopy is a batch's COPY input: the rows of its lines, chunk after
// chunk as the workers decode them, each line checked in file order before
// its row is sent: its own problem (format, type, payload), its id not
// repeated, its stream's versions contiguous and continuing the version
// the log holds. An event at or below its stream's version in the log is
// not sent but set aside (seen) for checking against the log after the
// COPY. At the first bad line Read fails, which aborts the COPY, and err
// holds the line's error.
type importCopy struct {
	ctx    context.Context
	s      *Store
	b      *importBatch
	inline bool
	// current is each stream's version in the log (by index in b.refs).
	current []int64

	next  int      // the next chunk to check
	parts [][]byte // what is left to send
	ids   map[uuid.UUID]int
	prev  []int64 // each stream's last version checked
	types []string
	end   bool

	keep, seen []int
	// lines counts the lines checked good; err is the first bad one's.
	lines int
	err   error
}

func (c *importCopy) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		if len(c.parts) == 0 {
			if err := c.fill(); err != nil {
				if n > 0 && errors.Is(err, io.EOF) {
					break
				}
				return n, err
			}
			continue
		}
		k := copy(p[n:], c.parts[0])
		n += k
		if c.parts[0] = c.parts[0][k:]; len(c.parts[0]) == 0 {
			c.parts = c.parts[1:]
		}
	}
	return n, nil
}

// fill queues what comes next: the header, the next chunk's rows once
// checked, the trailer, or io.EOF after it.
func (c *importCopy) fill() error {
	if c.err != nil {
		return c.err
	}
	b := c.b
	switch {
	case c.ids == nil:
		c.ids = make(map[uuid.UUID]int, len(b.spans))
		c.prev = make([]int64, len(b.refs))
		c.keep = make([]int, 0, len(b.spans))
		c.parts = append(c.parts, copyHeader)
		return nil
	case c.next < len(b.chunks):
		ch := b.chunks[c.next]
		select {
		case <-ch.done:
		case <-c.ctx.Done():
			c.err = c.ctx.Err()
			return c.err
		}
		c.next++
		if err := c.check(ch); err != nil {
			c.err = err
			return err
		}
		return nil
	case b.readErr != nil:
		c.err = b.readErr
		return c.err
	case !c.end:
		c.end = true
		c.parts = append(c.parts, copyTrailer)
		return nil
	}
	return io.EOF
}

// check checks the chunk's lines in order and queues the rows to send.
func (c *importCopy) check(ch *importChunk) error {
	b := c.b
	all := true
	c.types = c.types[:0]
	for i := ch.lo; i < ch.hi; i++ {
		line := b.lines[i]
		fail := func(err error) error {
			c.lines = i // the lines read before the bad one
			return &HistoryLineError{Line: line, Err: err}
		}
		if err := ch.errs[i-ch.lo]; err != nil {
			return fail(err)
		}
		h := &b.events[i]
		p := b.pre[i]
		if p.ref < 0 || b.refs[p.ref] != h.Stream.Ref() || p.version != h.Version {
			return errReplan
		}
		if prev, dup := c.ids[h.ID]; dup {
			return fail(fmt.Errorf("%w: event id %s repeats line %d", ErrInvalidHistory, h.ID, prev))
		}
		c.ids[h.ID] = line
		r := p.ref
		if i == b.firstAt[r] {
			if h.Version > c.current[r]+1 {
				return fail(fmt.Errorf("%w: stream %s is at version %d in the log; version %d would leave a gap",
					ErrInvalidHistory, b.refs[r], c.current[r], h.Version))
			}
		} else if h.Version != c.prev[r]+1 {
			return fail(fmt.Errorf("%w: stream %s version %d follows version %d (want %d)", ErrInvalidHistory, b.refs[r], h.Version, c.prev[r], c.prev[r]+1))
		}
		c.prev[r] = h.Version
		if c.inline && !slices.Contains(c.types, h.Type) {
			c.types = append(c.types, h.Type)
		}
		if h.Version <= c.current[r] {
			c.seen = append(c.seen, i)
			all = false
			continue
		}
		c.keep = append(c.keep, i)
	}
	if c.inline {
		if err := c.s.checkInline(c.ctx, c.types); err != nil {
			c.lines = ch.lo
			return err
		}
	}
	c.lines = ch.hi
	if all {
		c.parts = append(c.parts, ch.buf)
		return nil
	}
	for i := ch.lo; i < ch.hi; i++ {
		if h := &b.events[i]; h.Version > c.current[b.pre[i].ref] {
			c.parts = append(c.parts, b.rows[i])
		}
	}
	return nil
}
