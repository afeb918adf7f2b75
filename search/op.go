package search

import (
	"encoding/json"
	"fmt"
)

// OpKind says what an [Op] does to the index.
type OpKind int

const (
	// OpUpsert stores a whole document, replacing any with its id.
	OpUpsert OpKind = iota + 1
	// OpPatch merges fields into the document with its id (top-level
	// attributes replaced, the rest kept), creating it if missing.
	OpPatch
	// OpDelete removes the document with its id; a missing one is fine.
	OpDelete
	// OpDeleteWhere removes every document of the tenant matching all
	// filters.
	OpDeleteWhere
)

// String renders the kind for errors and logs.
func (k OpKind) String() string {
	switch k {
	case OpUpsert:
		return "upsert"
	case OpPatch:
		return "patch"
	case OpDelete:
		return "delete"
	case OpDeleteWhere:
		return "delete-where"
	}
	return fmt.Sprintf("OpKind(%d)", int(k))
}

// Op is one index operation, as handlers produce them and backends apply
// them, in order.
type Op struct {
	Kind OpKind
	// Tenant owns the document: the tenant of the event that produced the
	// op, or "" in a [Index.Shared] index.
	Tenant string
	// ID is the document's primary key (upsert, patch, delete).
	ID string
	// Doc is the document (upsert) or the fields to merge (patch), the
	// primary key included, as JSON attributes.
	Doc map[string]json.RawMessage
	// Filters select the documents a delete-where removes.
	Filters []Filter
}

// Writer collects the index operations of the events a handler is given.
// Backends apply them after the handlers of the batch ran, in the order
// they were made.
type Writer struct {
	idx    Index
	tenant string
	ops    []Op
}

// Upsert stores doc (a struct or map that encodes to a JSON object with
// the primary key), replacing the document with its id.
func (w *Writer) Upsert(doc any) error {
	fields, err := objectOf(doc)
	if err != nil {
		return err
	}
	id, err := documentID(fields, w.idx.PrimaryKey)
	if err != nil {
		return err
	}
	w.ops = append(w.ops, Op{Kind: OpUpsert, Tenant: w.tenant, ID: id, Doc: fields})
	return nil
}

// Patch merges fields (a struct or map that encodes to a JSON object) into
// the document with id: a partial update, for events that change a few
// attributes of a document another event created. A missing document is
// created with just these fields, as Meilisearch does.
func (w *Writer) Patch(id string, fields any) error {
	if id == "" {
		return fmt.Errorf("%w: patch with an empty id", ErrInvalidDocument)
	}
	doc, err := objectOf(fields)
	if err != nil {
		return err
	}
	if raw, ok := doc[w.idx.PrimaryKey]; ok {
		if got, err := idFromJSON(raw, w.idx.PrimaryKey); err != nil || got != id {
			return fmt.Errorf("%w: patch of %q carries primary key %s", ErrInvalidDocument, id, raw)
		}
	}
	key, _ := json.Marshal(id)
	doc[w.idx.PrimaryKey] = key
	w.ops = append(w.ops, Op{Kind: OpPatch, Tenant: w.tenant, ID: id, Doc: doc})
	return nil
}

// Delete removes the document with id; deleting a missing document
// succeeds, so replays are harmless.
func (w *Writer) Delete(id string) error {
	if id == "" {
		return fmt.Errorf("%w: delete with an empty id", ErrInvalidDocument)
	}
	w.ops = append(w.ops, Op{Kind: OpDelete, Tenant: w.tenant, ID: id})
	return nil
}

// DeleteWhere removes every document (of the event's tenant, in a
// tenant-owned index) matching all filters. At least one filter is
// required: emptying an index is a rebuild's job, not a handler's.
func (w *Writer) DeleteWhere(filters ...Filter) error {
	if len(filters) == 0 {
		return fmt.Errorf("%w: delete-where without filters", ErrInvalidFilter)
	}
	if err := w.idx.checkFilters(filters); err != nil {
		return err
	}
	w.ops = append(w.ops, Op{Kind: OpDeleteWhere, Tenant: w.tenant, Filters: append([]Filter(nil), filters...)})
	return nil
}

// objectOf encodes v and decodes it as a JSON object, refusing reserved
// attribute names.
func objectOf(v any) (map[string]json.RawMessage, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidDocument, err)
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(b, &fields); err != nil || fields == nil {
		return nil, fmt.Errorf("%w: %T does not encode to a JSON object", ErrInvalidDocument, v)
	}
	for k := range fields {
		if len(k) >= len(reservedPrefix) && k[:len(reservedPrefix)] == reservedPrefix {
			return nil, fmt.Errorf("%w: attribute %q: the prefix %q is reserved", ErrInvalidDocument, k, reservedPrefix)
		}
	}
	return fields, nil
}

// Compact folds ops into as few as give the same result: between two
// delete-wheres (which keep their place), the operations on one document
// become one — an upsert (a patch merged into the upsert before it, or a
// patch after a delete, which creates the document afresh), a patch
// (patches merged in order) or a delete — and come grouped by kind:
// upserts, then patches, then deletes, each in the order its document was
// first touched. Operations on different documents commute, so a backend
// that sends each group as one request (Meilisearch) needs at most three
// requests per stretch instead of one per change of kind.
func Compact(ops []Op) []Op {
	var out []Op
	type state struct {
		kind OpKind
		op   Op
	}
	var order []string
	byKey := map[string]*state{}
	flush := func() {
		for _, kind := range []OpKind{OpUpsert, OpPatch, OpDelete} {
			for _, k := range order {
				if st := byKey[k]; st.kind == kind {
					out = append(out, st.op)
				}
			}
		}
		order, byKey = order[:0], map[string]*state{}
	}
	for _, op := range ops {
		if op.Kind == OpDeleteWhere {
			flush()
			out = append(out, op)
			continue
		}
		k := op.Tenant + "\x00" + op.ID
		st := byKey[k]
		if st == nil {
			st = &state{}
			byKey[k] = st
			order = append(order, k)
		}
		switch op.Kind {
		case OpUpsert:
			st.kind, st.op = OpUpsert, op
		case OpPatch:
			switch st.kind {
			case OpUpsert, OpPatch:
				doc := make(map[string]json.RawMessage, len(st.op.Doc)+len(op.Doc))
				for a, v := range st.op.Doc {
					doc[a] = v
				}
				for a, v := range op.Doc {
					doc[a] = v
				}
				st.op.Doc = doc
			case OpDelete:
				// Deleted, then patched: the document is created with just
				// these fields, which is an upsert of them.
				st.kind, st.op = OpUpsert, op
				st.op.Kind = OpUpsert
			default:
				st.kind, st.op = OpPatch, op
			}
		case OpDelete:
			st.kind, st.op = OpDelete, op
		}
	}
	flush()
	return out
}
