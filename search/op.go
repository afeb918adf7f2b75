package search

import (
	"bytes"
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
	// Raw is Doc encoded as one JSON object, when the [Writer] has that
	// encoding at hand (nil otherwise, and after [Compact] merged ops): a
	// backend that stores a document's JSON as is uses it instead of
	// encoding Doc again. It holds the same attributes as Doc.
	Raw json.RawMessage
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
	fields, raw, err := objectOf(doc)
	if err != nil {
		return err
	}
	id, err := documentID(fields, w.idx.PrimaryKey)
	if err != nil {
		return err
	}
	w.ops = append(w.ops, Op{Kind: OpUpsert, Tenant: w.tenant, ID: id, Doc: fields, Raw: raw})
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
	if err := checkID(id); err != nil {
		return err
	}
	doc, raw, err := objectOf(fields)
	if err != nil {
		return err
	}
	if got, ok := doc[w.idx.PrimaryKey]; ok {
		if got, err := idFromJSON(got, w.idx.PrimaryKey); err != nil || got != id {
			return fmt.Errorf("%w: patch of %q carries primary key %s", ErrInvalidDocument, id, doc[w.idx.PrimaryKey])
		}
	} else {
		key, _ := json.Marshal(id)
		doc[w.idx.PrimaryKey] = key
		raw = withAttr(raw, w.idx.PrimaryKey, key)
	}
	w.ops = append(w.ops, Op{Kind: OpPatch, Tenant: w.tenant, ID: id, Doc: doc, Raw: raw})
	return nil
}

// withAttr returns the JSON object obj with the attribute name (which it
// does not have) set to value, spliced in front of its other attributes
// rather than decoded and encoded again.
func withAttr(obj json.RawMessage, name string, value json.RawMessage) json.RawMessage {
	obj = bytes.TrimSpace(obj)
	key, _ := json.Marshal(name)
	out := make([]byte, 0, len(obj)+len(key)+len(value)+2)
	out = append(out, '{')
	out = append(out, key...)
	out = append(out, ':')
	out = append(out, value...)
	if rest := bytes.TrimSpace(obj[1:]); len(rest) > 0 && rest[0] != '}' {
		out = append(out, ',')
	}
	return append(out, obj[1:]...)
}

// Delete removes the document with id; deleting a missing document
// succeeds, so replays are harmless.
func (w *Writer) Delete(id string) error {
	if id == "" {
		return fmt.Errorf("%w: delete with an empty id", ErrInvalidDocument)
	}
	if err := checkID(id); err != nil {
		return err
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
// attribute names. It returns the encoding too, for backends that store
// it as is (Op.Raw).
func objectOf(v any) (map[string]json.RawMessage, json.RawMessage, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %w", ErrInvalidDocument, err)
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(b, &fields); err != nil || fields == nil {
		return nil, nil, fmt.Errorf("%w: %T does not encode to a JSON object", ErrInvalidDocument, v)
	}
	for k := range fields {
		if len(k) >= len(reservedPrefix) && k[:len(reservedPrefix)] == reservedPrefix {
			return nil, nil, fmt.Errorf("%w: attribute %q: the prefix %q is reserved", ErrInvalidDocument, k, reservedPrefix)
		}
	}
	return fields, b, nil
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
				st.op.Doc, st.op.Raw = doc, nil // merged: no encoding at hand
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
