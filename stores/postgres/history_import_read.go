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
	"time"

	"github.com/google/uuid"

	"github.com/projectorhq/projector"
)

// readBatch is one batch as read and checked, or the error that stopped
// the reading.
type readBatch struct {
	batch *importBatch
	err   error
}

// readBatches reads and checks batches in a goroutine of its own, one
// ahead of the batch being written, so that decoding and copying overlap
// instead of adding up; each batch's lines are decoded by workers
// goroutines at once. The channel closes after the last batch, after an
// error, or once ctx ends (the caller's deferred cancel on return); a read
// blocked on r returns when r does.
func (s *Store) readBatches(ctx context.Context, dec *HistoryDecoder, size, workers int) <-chan readBatch {
	out := make(chan readBatch, 1)
	go func() {
		defer close(out)
		hint := 0
		for {
			b := &importBatch{}
			done, err := b.read(dec, s.registry, size, workers, hint)
			hint = b.textSize
			select {
			case out <- readBatch{batch: b, err: err}:
			case <-ctx.Done():
				return
			}
			if done || err != nil {
				return
			}
		}
	}()
	return out
}

// importBatch is one batch of a history file, checked on its own.
type importBatch struct {
	// text holds the batch's lines back to back; spans[i] is line i's.
	text  []byte
	spans [][2]int
	lines []int
	// textSize is len(text), kept after text is dropped: the next batch's
	// first guess.
	textSize int
	// readErr is the error that ended the reading after the lines held.
	readErr error

	events []HistoryEvent
	// payloads and data are the events' payloads decoded and upcast by
	// the registry, for inline projections.
	payloads []any
	data     [][]byte
	// chunks are the events' rows in COPY's binary format, in file order,
	// one chunk per decoding worker; rows[i] is event i's.
	chunks [][]byte
	rows   [][]byte
	// last is each stream's last version in the batch.
	last map[projector.StreamRef]int64
}

// read fills the batch with up to size events and checks what can be
// checked without the database; done reports the end of the file. The
// lines are read in order, decoded and checked each on its own by workers
// goroutines, then checked against each other in order; the error is the
// one of the first bad line, as if the lines were read one by one.
func (b *importBatch) read(dec *HistoryDecoder, reg *projector.Registry, size, workers, hint int) (done bool, err error) {
	b.text = make([]byte, 0, hint)
	// Sized for the batch (up to a bound, for a small file read with a
	// large batch size), so that the line index is not copied as it grows.
	b.spans, b.lines = make([][2]int, 0, min(size, 1<<14)), make([]int, 0, min(size, 1<<14))
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
	}
	n := len(b.spans)
	b.events, b.payloads, b.data, b.rows = make([]HistoryEvent, n), make([]any, n), make([][]byte, n), make([][]byte, n)
	errs := make([]error, n)
	workers = max(1, min(workers, n/256))
	b.chunks = make([][]byte, workers)
	var wg sync.WaitGroup
	for w := range workers {
		lo, hi := n*w/workers, n*(w+1)/workers
		wg.Go(func() { b.chunks[w] = b.decodeRange(reg, lo, hi, errs) })
	}
	wg.Wait()

	b.last = make(map[projector.StreamRef]int64, n/8)
	ids := make(map[uuid.UUID]int, n)
	for i := range n {
		line := b.lines[i]
		fail := func(err error) (bool, error) {
			b.events = b.events[:i] // the events read before the bad one
			return false, &HistoryLineError{Line: line, Err: err}
		}
		if errs[i] != nil {
			return fail(errs[i])
		}
		h := &b.events[i]
		if prev, dup := ids[h.ID]; dup {
			return fail(fmt.Errorf("%w: event id %s repeats line %d", ErrInvalidHistory, h.ID, prev))
		}
		ids[h.ID] = line
		ref := h.Stream.Ref()
		if last, seen := b.last[ref]; seen && h.Version != last+1 {
			return fail(fmt.Errorf("%w: stream %s version %d follows version %d (want %d)", ErrInvalidHistory, ref, h.Version, last, last+1))
		}
		b.last[ref] = h.Version
	}
	b.textSize, b.text, b.spans = len(b.text), nil, nil
	return done, b.readErr
}

// decodeRange decodes and checks lines lo to hi of the batch on their own
// (the format, the type, the payload) and encodes each good one as a COPY
// row, returning the rows' chunk; errs[i] is line i's problem.
func (b *importBatch) decodeRange(reg *projector.Registry, lo, hi int, errs []error) []byte {
	if lo == hi {
		return nil
	}
	// A row is about as long as its line, plus the field lengths; sized
	// once, the chunk is not copied over and over as it grows.
	chunk := make([]byte, 0, b.spans[hi-1][1]-b.spans[lo][0]+64*(hi-lo))
	starts := make([]int, 0, hi-lo)
	for i := lo; i < hi; i++ {
		starts = append(starts, len(chunk))
		h := &b.events[i]
		if err := decodeHistoryEvent(b.text[b.spans[i][0]:b.spans[i][1]], h); err != nil {
			errs[i] = err
			continue
		}
		payload, data, err := reg.Decode(h.Type, h.SchemaVersion, h.Payload)
		if err == nil {
			err = validatePayload(payload)
		}
		if err != nil {
			errs[i] = fmt.Errorf("event %s: %w", h.ID, err)
			continue
		}
		if h.Metadata.CorrelationID == uuid.Nil {
			h.Metadata.CorrelationID = h.ID
		}
		b.payloads[i], b.data[i] = payload, data
		if chunk, err = appendCopyRow(chunk, h); err != nil {
			errs[i] = fmt.Errorf("%w: %w", ErrInvalidHistory, err)
		}
	}
	for j, i := 0, lo; i < hi; i, j = i+1, j+1 {
		end := len(chunk)
		if i+1 < hi {
			end = starts[j+1]
		}
		b.rows[i] = chunk[starts[j]:end:end]
	}
	return chunk
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
// instead of handing values to pgx to encode one by one as it copies.
func appendCopyRow(buf []byte, h *HistoryEvent) ([]byte, error) {
	var headers []byte // nil: NULL, as an append stores no headers
	if len(h.Metadata.Headers) > 0 {
		var err error
		if headers, err = json.Marshal(h.Metadata.Headers); err != nil {
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
	buf = appendCopyJSONB(buf, h.Payload)
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
	return buf, nil
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

// copyData is the COPY input for the batch's kept events, in file order:
// the chunks as they are when every event is kept (the usual case), the
// kept rows one by one otherwise.
func (b *importBatch) copyData(keep []int) io.Reader {
	parts := make([][]byte, 0, 2+len(b.chunks))
	parts = append(parts, copyHeader)
	if len(keep) == len(b.events) {
		parts = append(parts, b.chunks...)
	} else {
		for _, k := range keep {
			parts = append(parts, b.rows[k])
		}
	}
	return &partsReader{parts: append(parts, copyTrailer)}
}

// partsReader reads byte slices one after the other.
type partsReader struct{ parts [][]byte }

func (r *partsReader) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) && len(r.parts) > 0 {
		c := copy(p[n:], r.parts[0])
		n += c
		if r.parts[0] = r.parts[0][c:]; len(r.parts[0]) == 0 {
			r.parts = r.parts[1:]
		}
	}
	if n == 0 && len(r.parts) == 0 {
		return 0, io.EOF
	}
	return n, nil
}

// importCopySQL is the import's COPY statement.
func (s *Store) importCopySQL() string {
	return s.sqlFor(`COPY {{s}}.projector_events (` + strings.Join(importColumns, ", ") + `) FROM STDIN (FORMAT binary)`)
}

// importWorkers is how many goroutines decode a batch's lines.
func importWorkers() int { return runtime.GOMAXPROCS(0) }
