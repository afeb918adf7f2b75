package postgres

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
)

// An import writes what a history file holds, and an event's declared
// personal fields are either sealed in the file (an export writes them as
// stored) or in the clear (history written by another tool). The log must
// hold neither a clear value (promise 19: projector_events never holds
// them in the clear) nor an envelope no key of this schema opens (its reads
// would fail, once an append made the subject a new key). sealImported
// does, for a batch, in its transaction and before its COPY, what an
// append does for its events:
//
//   - clear personal fields are sealed under the subject's key, read or
//     created in the transaction as an append creates it (so the key
//     commits with the events);
//   - sealed ones are opened with the subject's key in this schema, which
//     must be there: a subject without a key row is refused (copy the key
//     rows from the source schema first, docs/history.md), one forgotten
//     here imports as forgotten, and an envelope the key does not open (the
//     same subject id with another key) is refused.
//
// Either way the inline projections are handed the event as a read gives
// it (opened, or null and Forgotten), never the envelopes. A line it
// refuses gets the error in its chunk, so the COPY reports the first bad
// line in file order, and nothing of the batch is written.
func (s *Store) sealImported(ctx context.Context, tx pgx.Tx, b *importBatch) error {
	for _, ch := range b.chunks {
		select {
		case <-ch.done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	changed := map[*importChunk]bool{}
	for i, orig := range b.sealedFrom { // sealed by a transaction rolled back
		b.events[i].Payload = orig
		changed[b.chunkOf(i)] = true
	}
	b.sealedFrom, b.forgotten = nil, nil
	kt, _ := s.keys.(*KeyTable)
	type sealedLine struct {
		i   int
		ch  *importChunk
		ref SubjectRef
		p   projector.Personal
	}
	var sealed []sealedLine
	var refs []SubjectRef
	seen := map[SubjectRef]bool{}
	st := s.newSealing(false)
	for _, ch := range b.chunks {
		for i := ch.lo; i < ch.hi; i++ {
			errp := &ch.errs[i-ch.lo]
			if *errp != nil {
				continue
			}
			h := &b.events[i]
			p, ok := s.registry.PersonalOf(h.Type)
			if !ok {
				continue
			}
			fail := func(err error) { *errp = fmt.Errorf("event %s: %w", h.ID, err) }
			if !projector.IsSealed(h.Payload) {
				if !p.HoldsClearValue(h.Payload) {
					continue
				}
				data, _, forgotten, err := s.seal(ctx, tx, h.Stream.Tenant, projector.Encoded{Type: h.Type, SchemaVersion: h.SchemaVersion, Data: h.Payload}, st, false)
				if err != nil {
					if ctx.Err() != nil {
						return err
					}
					fail(fmt.Errorf("seal personal fields: %w", err))
					continue
				}
				if b.sealedFrom == nil {
					b.sealedFrom = map[int]json.RawMessage{}
				}
				b.sealedFrom[i], h.Payload = h.Payload, data
				changed[ch] = true
				if forgotten {
					// The subject was forgotten here: its inline
					// projections must not see the values the log
					// never holds, as an append's do not.
					view, _, err := projector.OpenWith(data, "", nil)
					if err == nil {
						err = s.viewAsRead(b, i, view, true)
					}
					if err != nil {
						fail(err)
					}
				}
				continue
			}
			if p.HoldsClearValue(h.Payload) {
				fail(fmt.Errorf("%w: personal fields partly sealed: every personal field with a value must be sealed, or none", ErrInvalidHistory))
				continue
			}
			id, err := p.SubjectOf(h.Payload)
			if err != nil {
				fail(err)
				continue
			}
			ref := SubjectRef{Tenant: h.Stream.Tenant, ID: id}
			sealed = append(sealed, sealedLine{i: i, ch: ch, ref: ref, p: p})
			if !seen[ref] {
				seen[ref] = true
				refs = append(refs, ref)
			}
		}
	}
	if len(sealed) > 0 {
		present, err := s.keyRows(ctx, tx, kt, refs)
		if err != nil {
			return err
		}
		ciphers, err := s.readKeyCiphers(ctx, tx, kt, refs)
		if err != nil {
			return err
		}
		for _, l := range sealed {
			h := &b.events[l.i]
			errp := &l.ch.errs[l.i-l.ch.lo]
			if present != nil && !present[l.ref] {
				*errp = fmt.Errorf("event %s: %w: its personal fields are sealed under the key of subject %s, which this schema does not have: copy the subject's row of projector_subject_keys from the source schema before importing (the same master key must unwrap it), see docs/history.md",
					h.ID, ErrInvalidHistory, projector.Printable(l.ref.String()))
				continue
			}
			opened, forgotten, err := projector.OpenStored(h.Payload, l.ref.ID, ciphers[l.ref])
			if err != nil {
				*errp = fmt.Errorf("event %s: %w: subject %s's key in this schema does not open its personal fields (another subject's key under the same id?): %w",
					h.ID, ErrInvalidHistory, projector.Printable(l.ref.String()), err)
				continue
			}
			if err := s.viewAsRead(b, l.i, opened, forgotten); err != nil {
				*errp = fmt.Errorf("event %s: %w", h.ID, err)
			}
		}
	}
	for ch := range changed {
		if err := b.encodeRows(ch, s.registry); err != nil {
			return err
		}
	}
	return nil
}

// viewAsRead sets line i's event, as its inline projections are handed
// it, to data (its payload as a read returns it), marked Forgotten when
// forgotten.
func (s *Store) viewAsRead(b *importBatch, i int, data json.RawMessage, forgotten bool) error {
	h := &b.events[i]
	payload, decoded, err := s.registry.Decode(h.Type, h.SchemaVersion, data)
	if err != nil {
		return err
	}
	b.payloads[i], b.data[i] = payload, decoded
	if forgotten {
		if b.forgotten == nil {
			b.forgotten = map[int]bool{}
		}
		b.forgotten[i] = true
	}
	return nil
}

// keyRows reports which of refs have a row in the key table, forgotten or
// not; nil (every subject taken as present) for a key store of another
// kind, which cannot tell a forgotten subject from one without a key.
//
// The rows are locked FOR SHARE until tx ends, as an append's key read
// locks them (KeyTable.DataKey): a forget's Destroy of one of them waits
// for the import, whose inline projections are handed the fields opened,
// so the forget's own inline forget sees (and deletes) what they wrote.
// Read without the lock, a forget could commit between this read and the
// import's commit, deleting nothing, and the import then committed the
// subject's fields in the clear into a read model after the forget. A
// forget that committed first is seen through the lock: the key read that
// follows, in a statement of its own, finds the subject forgotten.
func (s *Store) keyRows(ctx context.Context, tx pgx.Tx, kt *KeyTable, refs []SubjectRef) (map[SubjectRef]bool, error) {
	if kt == nil {
		return nil, nil
	}
	tenants, subjects := make([]string, len(refs)), make([]string, len(refs))
	for i, r := range refs {
		tenants[i], subjects[i] = r.Tenant, r.ID
	}
	rows, err := tx.Query(ctx, s.sqlFor(`SELECT k.tenant_id, k.subject FROM {{s}}.projector_subject_keys k
		JOIN unnest($1::text[], $2::text[]) AS u(tenant_id, subject) USING (tenant_id, subject)
		ORDER BY k.tenant_id, k.subject FOR SHARE OF k`), tenants, subjects)
	if err != nil {
		return nil, fmt.Errorf("read the subjects' key rows: %w", err)
	}
	present := make(map[SubjectRef]bool, len(refs))
	var ref SubjectRef
	if _, err := pgx.ForEachRow(rows, []any{&ref.Tenant, &ref.ID}, func() error {
		present[ref] = true
		return nil
	}); err != nil {
		return nil, fmt.Errorf("read the subjects' key rows: %w", err)
	}
	return present, nil
}

// encodeRows encodes the chunk's good lines again as COPY rows, after
// their payloads changed.
func (b *importBatch) encodeRows(ch *importChunk, reg *projector.Registry) error {
	buf := make([]byte, 0, len(ch.buf)+256*(ch.hi-ch.lo))
	starts := make([]int, 0, ch.hi-ch.lo+1)
	var personal typePersonal
	for i := ch.lo; i < ch.hi; i++ {
		starts = append(starts, len(buf))
		if ch.errs[i-ch.lo] != nil {
			continue
		}
		var err error
		if buf, err = appendCopyRow(buf, &b.events[i], personalOf(&personal, reg, b.events[i].Type)); err != nil {
			ch.errs[i-ch.lo] = fmt.Errorf("%w: %w", ErrInvalidHistory, err)
		}
	}
	starts = append(starts, len(buf))
	for j := range ch.hi - ch.lo {
		b.rows[ch.lo+j] = buf[starts[j]:starts[j+1]:starts[j+1]]
	}
	ch.buf = buf
	return nil
}
