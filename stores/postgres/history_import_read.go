package postgres

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/projectorhq/projector"
)

// readBatches reads batches in a goroutine of its own, one ahead of the
// batch being written. A batch is sent as soon as its lines are read and
// their streams and versions prescanned (which is all the statement before
// its COPY needs); workers goroutines then decode its lines in chunks, in
// file order, and the writer streams each chunk's rows to COPY as soon as
// it is decoded, so that decoding overlaps copying within a batch as well
// as across batches. The channel closes after the last batch, after a
// batch that ends the reading (an I/O error), or once ctx ends (the
// caller's deferred cancel on return); a read blocked on r returns when r
// does.
//
// A batch the writer is done with and sends on free is read into again,
// its buffers (the lines' text, the events, the COPY rows) reused rather
// than allocated anew: on two cores shared with the server, the fresh
// memory of each batch (14 MB for 10,000 exported events, zeroed and
// faulted in) was a large share of the client's CPU per line
// (docs/performance.md "History import").
func (s *Store) readBatches(ctx context.Context, dec *HistoryDecoder, size, workers int, free <-chan *importBatch) <-chan *importBatch {
	out := make(chan *importBatch, 1)
	go func() {
		defer close(out)
		hint := 0
		for {
			var b *importBatch
			select {
			case b = <-free:
				b.reset()
			default:
				b = &importBatch{}
			}
			done := b.read(dec, size, hint)
			hint = len(b.text)
			wait := b.decode(s.registry, workers)
			select {
			case out <- b:
			case <-ctx.Done():
			}
			// The next batch's lines are read once this one's are
			// decoded: the workers are never left running (so a batch
			// given back to free has no worker left on it), and at most
			// two batches are held besides the one being written.
			wait()
			if done || b.readErr != nil || ctx.Err() != nil {
				return
			}
		}
	}()
	return out
}

// importChunkLines is how many lines a decoding worker takes at a time: the
// COPY of a batch starts once its first chunk is decoded.
const importChunkLines = 512

// importBatch is one batch of a history file.
type importBatch struct {
	// text holds the batch's lines back to back; spans[i] is line i's.
	text  []byte
	spans [][2]int
	lines []int
	// readErr is the error that ended the reading after the lines held.
	readErr error

	// pre is each line's stream and version as prescanned; refs are the
	// batch's streams in order of first appearance, with the last version
	// the batch holds of each and the index of the line of its first
	// event.
	pre       []preLine
	refs      []projector.StreamRef
	last      []int64
	firstAt   []int
	replanned bool

	events []HistoryEvent
	// payloads and data are the events' payloads decoded and upcast by
	// the registry, for inline projections.
	payloads []any
	data     [][]byte
	// rows[i] is event i's row in COPY's binary format, within its
	// chunk's buffer.
	rows   [][]byte
	chunks []*importChunk
	// sealedFrom holds the payloads as read of the lines whose clear
	// personal fields a transaction of the batch sealed (sealImported), to
	// seal again should the batch be written once more (a replan).
	sealedFrom map[int]json.RawMessage
	// forgotten marks the lines whose subject is forgotten, handed to the
	// inline projections Forgotten as reads return them.
	forgotten map[int]bool
	// spare are the chunks of the batch's previous use, whose buffers
	// the new chunks take over.
	spare []*importChunk
}

// preLine is a line's stream (an index into importBatch.refs, -1 for a
// line that does not decode) and version, read before the line is decoded.
type preLine struct {
	ref     int
	version int64
}

// importChunk is a run of a batch's lines decoded by one worker: buf holds
// their COPY rows back to back, errs[i-lo] line i's own problem; done
// closes once they are decoded.
type importChunk struct {
	lo, hi int
	buf    []byte
	errs   []error
	done   chan struct{}
}

// read reads up to size lines into the batch and prescans each for its
// stream and version; done reports the end of the file.
func (b *importBatch) read(dec *HistoryDecoder, size, hint int) (done bool) {
	if cap(b.text) < hint {
		b.text = make([]byte, 0, hint)
	}
	// Sized for the batch (up to a bound, for a small file read with a
	// large batch size), so that the line index is not copied as it grows.
	if b.spans == nil {
		b.spans, b.lines = make([][2]int, 0, min(size, 1<<14)), make([]int, 0, min(size, 1<<14))
		b.pre = make([]preLine, 0, min(size, 1<<14))
	}
	index, refs := map[string]int{}, map[projector.StreamRef]int{}
	for len(b.spans) < size {
		line, n, err := dec.nextLine()
		if errors.Is(err, io.EOF) {
			done = true
			break
		}
		if err != nil {
			b.readErr = err
			break
		}
		b.spans = append(b.spans, [2]int{len(b.text), len(b.text) + len(line)})
		b.text = append(b.text, line...)
		b.lines = append(b.lines, n)
		p := preLine{ref: -1}
		if stream, version, ok := prescanHistoryLine(line); ok {
			if version >= 1 {
				p = preLine{ref: b.planRaw(index, refs, stream, version, len(b.pre)), version: version}
			}
		} else {
			// Not as Export writes it: decoded here, and again by its
			// worker, which reports what is wrong with it.
			var h HistoryEvent
			if decodeHistoryEvent(line, &h) == nil && h.Version >= 1 {
				p = preLine{ref: b.plan(refs, h.Stream.Ref(), h.Version, len(b.pre)), version: h.Version}
			}
		}
		b.pre = append(b.pre, p)
	}
	return done
}

// planRaw is plan for a stream as prescanHistoryLine read it: a stream
// member seen before, as written, is found without making its strings.
func (b *importBatch) planRaw(index map[string]int, refs map[projector.StreamRef]int, stream []byte, version int64, i int) int {
	r, ok := index[string(stream)]
	if !ok {
		r = b.plan(refs, prescanStream(stream), version, i)
		index[string(stream)] = r
		return r
	}
	if r >= 0 {
		b.last[r] = version
	}
	return r
}

// plan notes a line of stream ref at version, line i of the batch, and
// returns the stream's index in refs.
func (b *importBatch) plan(index map[projector.StreamRef]int, ref projector.StreamRef, version int64, i int) int {
	r, ok := index[ref]
	if !ok {
		if ref.Validate() != nil {
			return -1 // a stream no log could hold: its line's worker says why
		}
		r = len(b.refs)
		index[ref] = r
		b.refs = append(b.refs, ref)
		b.last, b.firstAt = append(b.last, version), append(b.firstAt, i)
		return r
	}
	b.last[r] = version
	return r
}

// replan sets the batch's streams and versions from its decoded events
// instead of the prescan, which read a line differently (a member given
// twice, which encoding/json reads as its last): the events are what is
// written, so the statement before the COPY must see theirs.
func (b *importBatch) replan() {
	b.waitDecoded()
	b.replanned = true
	b.refs, b.last, b.firstAt = nil, nil, nil
	index := map[projector.StreamRef]int{}
	for i := range b.pre {
		b.pre[i] = preLine{ref: -1}
		if b.chunkOf(i).errs[i-b.chunkOf(i).lo] == nil {
			h := &b.events[i]
			b.pre[i] = preLine{ref: b.plan(index, h.Stream.Ref(), h.Version, i), version: h.Version}
		}
	}
}

// reset empties a batch the writer is done with for reading into again,
// keeping its buffers: the lines' text and index, the events, the COPY
// rows and each chunk's buffer and errors. Nothing may hold on to what
// the batch held (the writer gives back only a batch written without
// inline projections, which are handed its events' bytes).
func (b *importBatch) reset() {
	b.spare = append(b.spare, b.chunks...)
	clear(b.payloads) // decoded values, not to be kept alive
	clear(b.data)
	*b = importBatch{
		text: b.text[:0], spans: b.spans[:0], lines: b.lines[:0], pre: b.pre[:0],
		refs: b.refs[:0], last: b.last[:0], firstAt: b.firstAt[:0],
		events: b.events[:0], payloads: b.payloads[:0], data: b.data[:0], rows: b.rows[:0],
		chunks: b.chunks[:0], spare: b.spare,
	}
}

// grow returns s at length n, reusing its array when it is large enough.
// The elements are not cleared: the caller sets each one.
func grow[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}

func (b *importBatch) chunkOf(i int) *importChunk { return b.chunks[i/importChunkLines] }

func (b *importBatch) waitDecoded() {
	for _, c := range b.chunks {
		<-c.done
	}
}

// decode starts workers goroutines decoding the batch's lines, chunk after
// chunk in file order, and returns a function waiting for them.
func (b *importBatch) decode(reg *projector.Registry, workers int) (wait func()) {
	n := len(b.spans)
	// Every line's event and row is set by its worker; the payloads and
	// data only for good lines, and errs only for bad ones, so those
	// start cleared.
	b.events, b.payloads, b.data, b.rows = grow(b.events, n), grow(b.payloads, n), grow(b.data, n), grow(b.rows, n)
	clear(b.payloads)
	clear(b.data)
	for lo := 0; lo < n; lo += importChunkLines {
		hi := min(lo+importChunkLines, n)
		c := &importChunk{}
		if k := len(b.spare); k > 0 {
			c, b.spare = b.spare[k-1], b.spare[:k-1]
		}
		*c = importChunk{lo: lo, hi: hi, buf: c.buf[:0], errs: grow(c.errs, hi-lo), done: make(chan struct{})}
		clear(c.errs)
		b.chunks = append(b.chunks, c)
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range max(1, min(workers, len(b.chunks))) {
		wg.Go(func() {
			for {
				k := int(next.Add(1) - 1)
				if k >= len(b.chunks) {
					return
				}
				b.decodeChunk(reg, b.chunks[k])
				close(b.chunks[k].done)
			}
		})
	}
	return wg.Wait
}

// decodeChunk decodes and checks the chunk's lines on their own (the
// format, the type, the payload) and encodes each good one as a COPY row.
func (b *importBatch) decodeChunk(reg *projector.Registry, c *importChunk) {
	// A row is about as long as its line, plus the field lengths; sized
	// once, the buffer is not copied over and over as it grows.
	if need := b.spans[c.hi-1][1] - b.spans[c.lo][0] + 64*(c.hi-c.lo); cap(c.buf) < need {
		c.buf = make([]byte, 0, need)
	}
	starts := make([]int, 0, c.hi-c.lo+1)
	// The batch's text outlives its events' use, so payloads stay in it;
	// and the registry parses each payload whole (json.Unmarshal checks
	// the JSON before it decodes), so the line decoder does not check it
	// first.
	cache := &lineCache{alias: true, unchecked: true}
	var personal typePersonal
	for i := c.lo; i < c.hi; i++ {
		starts = append(starts, len(c.buf))
		errs := &c.errs[i-c.lo]
		h := &b.events[i]
		line := b.text[b.spans[i][0]:b.spans[i][1]]
		if err := decodeHistoryEventWith(line, h, cache); err != nil {
			*errs = err
			continue
		}
		payload, data, err := reg.Decode(h.Type, h.SchemaVersion, h.Payload)
		if (err != nil || !sameBytes(data, h.Payload)) && !json.Valid(h.Payload) {
			// The registry did not parse this very payload (it failed,
			// or upcast it), and it is not JSON: the line is decoded
			// again as everywhere else, which names the error.
			if derr := decodeHistoryEvent(line, h); derr != nil {
				*errs = derr
				continue
			}
			err = fmt.Errorf("%w: payload is not valid JSON", ErrInvalidHistory)
		}
		if err == nil {
			err = validatePayload(payload)
		}
		if err != nil {
			*errs = fmt.Errorf("event %s: %w", h.ID, err)
			continue
		}
		if h.Metadata.CorrelationID == uuid.Nil {
			h.Metadata.CorrelationID = h.ID
		}
		b.payloads[i], b.data[i] = payload, data
		if c.buf, err = appendCopyRow(c.buf, h, personalOf(&personal, reg, h.Type)); err != nil {
			*errs = fmt.Errorf("%w: %w", ErrInvalidHistory, err)
		}
	}
	starts = append(starts, len(c.buf))
	for j := range c.hi - c.lo {
		b.rows[c.lo+j] = c.buf[starts[j]:starts[j+1]:starts[j+1]]
	}
}

// sameBytes reports whether a and b are the same bytes in memory.
func sameBytes(a, b []byte) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}

// PostgreSQL's binary COPY framing: the signature, flags and header
// extension length before the rows, and a field count of -1 after them.
var (
	copyHeader  = []byte("PGCOPY\n\xff\r\n\x00\x00\x00\x00\x00\x00\x00\x00\x00")
	copyTrailer = []byte{0xff, 0xff}
)

// pgEpochMicros is PostgreSQL's timestamp epoch, 2000-01-01 UTC, in
// microseconds from the Unix epoch.
const pgEpochMicros = 946_684_800 * 1_000_000

// appendCopyRow appends h as one row of importColumns in COPY's binary
// format: the import writes the rows itself, in the decoding workers,
// instead of handing values to pgx to encode one by one as it copies. p
// is h's type's personal declaration: with EnvelopeApart, an event
// envelope in the payload (the form a history file carries) is written to
// the envelope column instead, as an append of the type writes it.
func appendCopyRow(buf []byte, h *HistoryEvent, p projector.Personal) ([]byte, error) {
	var headers []byte // nil: NULL, as an append stores no headers
	if len(h.Metadata.Headers) > 0 {
		var err error
		if headers, err = json.Marshal(h.Metadata.Headers); err != nil {
			return buf, err
		}
	}
	payload := h.Payload
	var envelope []byte
	if p.EnvelopeApart && p.OneEnvelope {
		var err error
		if payload, envelope, _, err = projector.DetachEnvelope(payload); err != nil {
			return buf, err
		}
	}
	buf = binary.BigEndian.AppendUint16(buf, uint16(len(importColumns)))
	buf = appendCopyBytes(buf, h.ID[:])
	buf = appendCopyText(buf, h.Stream.Tenant)
	buf = appendCopyText(buf, h.Stream.Type)
	buf = appendCopyText(buf, h.Stream.ID)
	buf = binary.BigEndian.AppendUint32(buf, 8)
	buf = binary.BigEndian.AppendUint64(buf, uint64(h.Version))
	buf = appendCopyText(buf, h.Type)
	buf = binary.BigEndian.AppendUint32(buf, 4)
	buf = binary.BigEndian.AppendUint32(buf, uint32(int32(h.SchemaVersion)))
	buf = appendCopyJSONB(buf, payload)
	buf = appendCopyBytes(buf, h.Metadata.CorrelationID[:])
	if h.Metadata.CausationID == uuid.Nil {
		buf = appendCopyNull(buf)
	} else {
		buf = appendCopyBytes(buf, h.Metadata.CausationID[:])
	}
	buf = appendCopyText(buf, h.Metadata.Actor)
	if headers == nil {
		buf = appendCopyNull(buf)
	} else {
		buf = appendCopyJSONB(buf, headers)
	}
	at := h.RecordedAt
	buf = binary.BigEndian.AppendUint32(buf, 8)
	buf = binary.BigEndian.AppendUint64(buf, uint64(at.Unix()*1_000_000+int64(at.Nanosecond())/int64(time.Microsecond)-pgEpochMicros))
	if envelope == nil {
		return appendCopyNull(buf), nil
	}
	return appendCopyBytes(buf, envelope), nil
}

func appendCopyBytes(buf, v []byte) []byte {
	buf = binary.BigEndian.AppendUint32(buf, uint32(len(v)))
	return append(buf, v...)
}

func appendCopyText(buf []byte, v string) []byte {
	buf = binary.BigEndian.AppendUint32(buf, uint32(len(v)))
	return append(buf, v...)
}

// appendCopyJSONB appends a jsonb value: version 1, then the JSON text.
func appendCopyJSONB(buf, v []byte) []byte {
	buf = binary.BigEndian.AppendUint32(buf, uint32(len(v)+1))
	buf = append(buf, 1)
	return append(buf, v...)
}

func appendCopyNull(buf []byte) []byte { return binary.BigEndian.AppendUint32(buf, 0xffffffff) }

// importCopySQL is the import's COPY statement.
func (s *Store) importCopySQL() string {
	return s.sqlFor(`COPY {{s}}.projector_events (` + strings.Join(importColumns, ", ") + `) FROM STDIN (FORMAT binary)`)
}

// importWorkers is how many goroutines decode a batch's lines.
func importWorkers() int { return runtime.GOMAXPROCS(0) }
