package search

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"

	"github.com/google/uuid"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

// ErrNotVerifiable: the projection's backend cannot list its documents
// (it does not implement [Lister]).
var ErrNotVerifiable = errors.New("search: the backend cannot list an index's documents, so it cannot be verified")

// DefaultVerifyAttempts is how often [Verify] reads again when the index
// moved while it read.
const DefaultVerifyAttempts = 5

// VerifyOptions tunes [Verify].
type VerifyOptions struct {
	// Sample compares the contents of only that many documents, picked
	// at random among those both the log and the index hold; 0 compares
	// all. Presence is always checked in full: every document missing
	// from the index or extra in it is reported whatever the sample.
	Sample int
	// Attempts is how often Verify reads again when the consumer's cursor
	// moved while it read the index; default [DefaultVerifyAttempts].
	Attempts int
	// PageSize bounds how many documents of each side Verify holds in
	// memory at once, default [DefaultVerifyPage]: it splits the documents
	// into pages by a hash of tenant and id, as many as the index's size
	// needs, and verifies one page at a time, replaying the log and
	// listing the index once per page. Memory is then bounded by the page,
	// at the price of one replay per page.
	PageSize int
}

// DefaultVerifyPage is how many documents [Verify] compares per page by
// default: about 45 MiB of Go heap for small documents, one replay of the
// log per 25,000 documents (docs/search.md).
const DefaultVerifyPage = 25_000

// maxVerifyPages bounds the pages: each costs a replay of the log.
const maxVerifyPages = 1000

// DiffKind says how an indexed document differs from what the log says.
type DiffKind string

// Kinds of [Difference].
const (
	Missing DiffKind = "missing" // the log says it should be there; it is not
	Extra   DiffKind = "extra"   // it is there; the log says it should not be
	Differs DiffKind = "differs" // both have it, with other contents
)

// Difference is one document on which the index and the log disagree.
type Difference struct {
	Kind   DiffKind
	Tenant string
	ID     string
	// Want is what the log says (nil when Extra); Got what the index holds
	// (nil when Missing).
	Want, Got json.RawMessage
}

// VerifyReport is what [Verify] found.
type VerifyReport struct {
	// Cursor is the consumer's position the comparison was made at; for a
	// partitioned consumer, the lowest of its partitions' cursors (every
	// partition had applied the log up to it at least).
	Cursor projector.Position
	// Partitions are, for a partitioned consumer, the cursor of each
	// partition the comparison was made at (of the last page): each
	// document was expected as of its stream's partition's cursor. Nil for
	// an unpartitioned one.
	Partitions []PartitionCursor
	// Events is how many events of the projection's types up to Cursor
	// were replayed (dead-lettered and skipped ones excluded).
	Events int
	// Expected and Indexed count the documents the log says the index
	// should hold and the documents it holds.
	Expected, Indexed int
	// Compared is how many documents held on both sides had their
	// contents compared (all, or the sample). Whatever the sample, every
	// document missing from the index or extra in it is in Differences.
	Compared int
	// Differences are in tenant and id order.
	Differences []Difference
	// Moved is set when the index kept moving during every attempt of a
	// page and the page was not read again holding the consumer: it
	// agreed with the log, or (a split or merge meanwhile) the held read
	// could not be made, and only then may the differences include
	// documents of batches in flight.
	Moved bool
}

// OK reports that the index holds what the log says: no difference was
// found and the index holds as many documents as the log says it should.
// A sample never makes a missing or extra document pass.
func (r VerifyReport) OK() bool { return len(r.Differences) == 0 && r.Expected == r.Indexed }

// Verify compares p's index with what the log says it should hold: it
// replays the events of p's types up to the consumer's cursor through p's
// handlers in memory (leaving out events the consumer dead-lettered or an
// operator skipped, which were never applied), and compares the result,
// document by document, with what the backend holds. Drift — a document
// changed or deleted by hand, a lost write — becomes a report instead of a
// support ticket.
//
// It pages: documents are split by a hash of tenant and id into as many
// pages as [VerifyOptions.PageSize] needs for the index's size, and each
// page is replayed, listed and compared on its own, so memory is bounded
// by a page, not the index.
//
// On a partitioned projection (AsyncConfig.Partitions) each event is
// replayed only up to the cursor of its own partition, the one its stream
// (or partition key) hashes into: the index holds a document as of that
// partition's cursor (verify_partition.go). A delete by filter, whose
// effect spans streams and so partitions, is replayed in log order, which
// the partitions did not keep: it may show as a difference there.
//
// The consumer may keep running: Verify reads the cursor before and after
// reading each page of the index, looks in between at the lock its passes
// hold from before their index write to their commit (without taking it),
// and reads again when the cursor moved or the lock was held: a batch on
// Meilisearch writes to the index before its cursor commits. A page still
// read while the consumer moved after every attempt, and that differs, is
// read once more holding the consumer (verify_held.go). Events pruned from
// the log cannot be replayed: documents only they explain show up as extra.
func Verify(ctx context.Context, store *postgres.Store, p *Projection, opts VerifyOptions) (VerifyReport, error) {
	if p.err != nil {
		return VerifyReport{}, p.err
	}
	if binder, ok := p.cfg.Backend.(DBBinder); ok {
		binder.BindDB(store.Pool())
	}
	lister, ok := p.cfg.Backend.(Lister)
	if !ok {
		return VerifyReport{}, fmt.Errorf("verify %q: %w (%s)", p.name, ErrNotVerifiable, p.cfg.Backend.Kind())
	}
	if opts.Sample < 0 {
		return VerifyReport{}, fmt.Errorf("verify %q: sample %d is negative", p.name, opts.Sample)
	}
	if opts.PageSize < 0 {
		return VerifyReport{}, fmt.Errorf("verify %q: page size %d is negative", p.name, opts.PageSize)
	}
	attempts := opts.Attempts
	if attempts <= 0 {
		attempts = DefaultVerifyAttempts
	}
	pageSize := opts.PageSize
	if pageSize == 0 {
		pageSize = DefaultVerifyPage
	}
	each := eachDocument(lister)
	indexed := 0
	if err := each(ctx, p.cfg.Index, func(Stored) error { indexed++; return nil }); err != nil {
		return VerifyReport{}, fmt.Errorf("verify %q: count the index: %w", p.name, err)
	}
	pages := min(maxVerifyPages, max(1, (indexed+pageSize-1)/pageSize))
	admin := projection.NewAdmin(store)
	id := projection.ShardID{Consumer: p.name, Instance: projection.SharedInstance}
	var report VerifyReport
	for page := range pages {
		inPage := func(tenant, docID string) bool { return pages == 1 || pageOf(tenant, docID, pages) == page }
		want := memIndex{idx: p.cfg.Index, docs: map[docKey]map[string]json.RawMessage{}, keep: inPage}
		listPage := func() ([]Stored, error) {
			var got []Stored
			err := each(ctx, p.cfg.Index, func(s Stored) error {
				if inPage(s.Tenant, s.ID) {
					got = append(got, s)
				}
				return nil
			})
			if err != nil {
				return nil, fmt.Errorf("list the index: %w", err)
			}
			return got, nil
		}
		var replayed cursors
		events := 0
		for attempt := 1; ; attempt++ {
			st, err := readCursors(ctx, store, admin, id)
			if err != nil {
				return VerifyReport{}, fmt.Errorf("verify %q: %w", p.name, err)
			}
			n, err := p.replaySince(ctx, store, &want, replayed, st)
			if err != nil {
				return VerifyReport{}, fmt.Errorf("verify %q: %w", p.name, err)
			}
			events += n
			replayed = st
			got, err := listPage()
			if err != nil {
				return VerifyReport{}, fmt.Errorf("verify %q: %w", p.name, err)
			}
			// A batch writes to an index outside the database (Meilisearch)
			// before its cursor commits: one in flight while the index was
			// read leaves documents ahead of a cursor that has not moved
			// (yet). Every batch holds its shard's lock from before its
			// write to its commit, so the lock found free, then the cursor
			// found where it was, proves none was: each that wrote had
			// committed before the first read or rolled back. The lock is
			// only looked at, never taken: the consumer never waits for
			// Verify.
			busy, err := projection.ShardsLocked(ctx, store, st.shards(p.name)...)
			if err != nil {
				return VerifyReport{}, fmt.Errorf("verify %q: %w", p.name, err)
			}
			after, err := readCursors(ctx, store, admin, id)
			if err != nil {
				return VerifyReport{}, fmt.Errorf("verify %q: %w", p.name, err)
			}
			moved := busy || !after.equal(st)
			if moved && attempt < attempts {
				continue
			}
			sample := 0
			if opts.Sample > 0 {
				// The sample is spread evenly over the pages (a page of
				// none compares nothing, -1).
				sample = opts.Sample / pages
				if page < opts.Sample%pages {
					sample++
				}
				if sample == 0 {
					sample = -1
				}
			}
			var found VerifyReport
			found.compare(want.docs, got, sample)
			if moved && !found.OK() {
				// The consumer kept moving through every attempt, and what
				// was read differs: perhaps only by batches in flight. Read
				// the page once more with the consumer held, for an answer
				// that is exact (verify_held.go).
				held, n, heldGot, ok, err := p.readPageHeld(ctx, store, admin, id, st, &want, listPage)
				if err != nil {
					return VerifyReport{}, fmt.Errorf("verify %q: %w", p.name, err)
				}
				if ok {
					st, moved = held, false
					events += n
					found = VerifyReport{}
					found.compare(want.docs, heldGot, sample)
				}
			}
			// Every page replays the same events; count them once.
			report.Events = events
			report.Cursor, report.Partitions, report.Moved = st.low(), st.report(), report.Moved || moved
			report.Expected, report.Indexed, report.Compared = report.Expected+found.Expected, report.Indexed+found.Indexed, report.Compared+found.Compared
			report.Differences = append(report.Differences, found.Differences...)
			break
		}
	}
	slices.SortFunc(report.Differences, func(a, b Difference) int {
		if c := strings.Compare(a.Tenant, b.Tenant); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	return report, nil
}

// pageOf is the page of pages a document belongs to: an FNV-1a hash of
// its tenant and id.
func pageOf(tenant, id string, pages int) int {
	h := fnv.New64a()
	_, _ = h.Write([]byte(tenant))
	_, _ = h.Write([]byte{0})
	_, _ = h.Write([]byte(id))
	return int(h.Sum64() % uint64(pages))
}

// DocumentStreamer is implemented by backends that can hand an index's
// documents over one at a time, in any order, without collecting them:
// [Verify] then holds only a page of them.
type DocumentStreamer interface {
	EachDocument(ctx context.Context, idx Index, fn func(Stored) error) error
}

// eachDocument streams the index's documents through the backend's
// DocumentStreamer, or from its full listing when it has none.
func eachDocument(l Lister) func(ctx context.Context, idx Index, fn func(Stored) error) error {
	if s, ok := l.(DocumentStreamer); ok {
		return s.EachDocument
	}
	return func(ctx context.Context, idx Index, fn func(Stored) error) error {
		docs, err := l.Documents(ctx, idx)
		if err != nil {
			return err
		}
		for _, d := range docs {
			if err := fn(d); err != nil {
				return err
			}
		}
		return nil
	}
}

// replayEach runs p's handlers over the events of its types in (from, to],
// in log order, archived ones included (`streams archive`: the index was
// built from them), leaving out those the consumer dead-lettered or an
// operator skipped, and those keep (when set) declines, and hands each
// event's operations to fn.
func (p *Projection) replayEach(ctx context.Context, store *postgres.Store, from, to projector.Position, keep func(projector.Event) (bool, error), fn func(w *Writer) error) error {
	if !from.Less(to) {
		return nil
	}
	dead, err := deadLettered(ctx, store, p.name)
	if err != nil {
		return err
	}
	types := make([]string, len(p.types))
	for i, t := range p.types {
		types[i] = t.Name()
	}
	for after := from; ; {
		batch, err := store.ReadLog(ctx, postgres.LogQuery{After: after, Limit: 1000, EventTypes: types, IncludeArchived: true})
		if err != nil {
			return fmt.Errorf("read the log: %w", err)
		}
		for _, ev := range batch.Events {
			if to.Less(ev.Position) {
				return nil
			}
			if dead[ev.ID] {
				continue
			}
			if keep != nil {
				ok, err := keep(ev)
				if err != nil {
					return err
				}
				if !ok {
					continue
				}
			}
			w := &Writer{idx: p.cfg.Index, tenant: ev.Stream.Tenant}
			if p.cfg.Index.Shared {
				w.tenant = ""
			}
			if err := p.fns[ev.Type](ctx, ev, w); err != nil {
				// The live consumer got past this event, so it did not fail
				// there: a handler that fails only now has changed.
				return fmt.Errorf("replay %s v%d of %s: %w", ev.Type, ev.Version, ev.Stream, err)
			}
			if err := fn(w); err != nil {
				return err
			}
		}
		if !batch.Full {
			return nil
		}
		after = batch.Events[len(batch.Events)-1].Position
	}
}

// deadLettered returns the ids of the events consumer never applied.
func deadLettered(ctx context.Context, store *postgres.Store, consumer string) (map[uuid.UUID]bool, error) {
	rows, err := store.Pool().Query(ctx, `SELECT event_id FROM `+store.Table("projector_dead_letters")+` WHERE consumer = $1`, consumer)
	if err != nil {
		return nil, fmt.Errorf("read dead letters: %w", err)
	}
	defer rows.Close()
	out := map[uuid.UUID]bool{}
	for rows.Next() {
		var id uuid.UUID
		if err := rows.Scan(&id); err != nil {
			return nil, fmt.Errorf("read dead letters: %w", err)
		}
		out[id] = true
	}
	return out, rows.Err()
}

type docKey struct{ tenant, id string }

// memIndex applies operations in memory with the meaning every backend
// gives them.
type memIndex struct {
	idx  Index
	docs map[docKey]map[string]json.RawMessage
	// keep, when set, says which documents this page holds; operations on
	// the others are left out.
	keep func(tenant, id string) bool
}

func (m *memIndex) apply(ops []Op) {
	for _, op := range ops {
		if op.Kind != OpDeleteWhere && m.keep != nil && !m.keep(op.Tenant, op.ID) {
			continue
		}
		k := docKey{op.Tenant, op.ID}
		switch op.Kind {
		case OpUpsert:
			m.docs[k] = cloneDoc(op.Doc)
		case OpPatch:
			d := m.docs[k]
			if d == nil {
				d = map[string]json.RawMessage{}
				m.docs[k] = d
			}
			for a, v := range op.Doc {
				d[a] = v
			}
		case OpDelete:
			delete(m.docs, k)
		case OpDeleteWhere:
			for dk, d := range m.docs {
				if dk.tenant == op.Tenant && matchesAll(d, op.Filters) {
					delete(m.docs, dk)
				}
			}
		}
	}
}

func cloneDoc(d map[string]json.RawMessage) map[string]json.RawMessage {
	c := make(map[string]json.RawMessage, len(d))
	for k, v := range d {
		c[k] = v
	}
	return c
}

// matchesAll: every filter's attribute equals its value, or is an array
// holding it.
func matchesAll(d map[string]json.RawMessage, filters []Filter) bool {
	for _, f := range filters {
		raw, ok := d[f.Attr]
		if !ok {
			return false
		}
		fv, err := f.JSON()
		if err != nil {
			return false
		}
		var have, want any
		if json.Unmarshal(raw, &have) != nil || json.Unmarshal(fv, &want) != nil {
			return false
		}
		if arr, ok := have.([]any); ok {
			if !slices.ContainsFunc(arr, func(e any) bool { return reflect.DeepEqual(e, want) }) {
				return false
			}
		} else if !reflect.DeepEqual(have, want) {
			return false
		}
	}
	return true
}

// compare adds to r what the expected documents and the indexed ones of a
// page say. Every document missing from the index or extra in it is
// reported whatever the sample: finding them costs a look-up, and a
// sample that could miss a lost write would make verification pass a
// broken index. Only the comparison of contents, which decodes both
// sides, is sampled: all documents on both sides (sample 0), sample of
// them (> 0), or none (< 0).
func (r *VerifyReport) compare(want map[docKey]map[string]json.RawMessage, got []Stored, sample int) {
	have := make(map[docKey]json.RawMessage, len(got))
	for _, s := range got {
		have[docKey{s.Tenant, s.ID}] = s.Doc
	}
	r.Expected, r.Indexed = r.Expected+len(want), r.Indexed+len(have)
	both := make([]docKey, 0, min(len(want), len(have)))
	for k, w := range want {
		if _, ok := have[k]; ok {
			both = append(both, k)
			continue
		}
		r.Differences = append(r.Differences, Difference{Kind: Missing, Tenant: k.tenant, ID: k.id, Want: canonical(w)})
	}
	for k, g := range have {
		if _, ok := want[k]; !ok {
			r.Differences = append(r.Differences, Difference{Kind: Extra, Tenant: k.tenant, ID: k.id, Got: g})
		}
	}
	slices.SortFunc(both, func(a, b docKey) int {
		if c := strings.Compare(a.tenant, b.tenant); c != 0 {
			return c
		}
		return strings.Compare(a.id, b.id)
	})
	if sample < 0 {
		both = nil
	}
	if sample > 0 && sample < len(both) {
		picked := rand.Perm(len(both))[:sample]
		slices.Sort(picked)
		sampled := make([]docKey, len(picked))
		for i, j := range picked {
			sampled[i] = both[j]
		}
		both = sampled
	}
	r.Compared += len(both)
	for _, k := range both {
		wantJSON := canonical(want[k])
		var gotDoc map[string]json.RawMessage
		if g := have[k]; json.Unmarshal(g, &gotDoc) != nil || !bytes.Equal(canonical(gotDoc), wantJSON) {
			r.Differences = append(r.Differences, Difference{Kind: Differs, Tenant: k.tenant, ID: k.id, Want: wantJSON, Got: g})
		}
	}
}

// canonical renders a document with sorted keys and normalised values, so
// two encodings of the same document compare equal.
func canonical(d map[string]json.RawMessage) json.RawMessage {
	v := make(map[string]any, len(d))
	for k, raw := range d {
		var x any
		if json.Unmarshal(raw, &x) == nil {
			v[k] = x
		}
	}
	b, _ := json.Marshal(v)
	return b
}
