package search

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"

	"github.com/projectorhq/projector"
)

// ErrInvalidIndex: an index was declared wrongly (a bad name, a bad or
// repeated attribute, a primary key that is also declared otherwise).
// Returned by [New] through the projection's registration error, so a
// bad declaration stops the start, not the first batch.
var ErrInvalidIndex = errors.New("search: invalid index")

// ErrInvalidDocument: a handler gave a document the index cannot hold (no
// primary key, a key that is not a string or an integer, not a JSON
// object). It is a handler error: the event is retried, then the shard
// halts (or the event is dead-lettered in continuous mode), so a broken
// document is never dropped silently.
var ErrInvalidDocument = errors.New("search: invalid document")

// ErrInvalidFilter: a filter names an attribute the index does not declare
// filterable, or has a value that is not a string, number or boolean.
var ErrInvalidFilter = errors.New("search: invalid filter")

// DefaultPrimaryKey is the primary key attribute of an index that declares
// none.
const DefaultPrimaryKey = "id"

// Index declares one search index: its name and the settings the backend
// applies when the index is created, before anything is written to it.
type Index struct {
	// Name is the index's stable name: lower-case letters, digits and
	// underscores, starting with a letter, at most 40 characters, so each
	// backend can use it as is (a Meilisearch index uid, part of a
	// PostgreSQL table name).
	Name string
	// PrimaryKey is the document attribute that identifies a document,
	// default [DefaultPrimaryKey]. Its value must be a string or an
	// integer.
	PrimaryKey string
	// Searchable are the attributes full-text queries look in, in order of
	// importance; none means every attribute (Meilisearch) or the whole
	// document's text (PostgreSQL).
	Searchable []string
	// Filterable are the attributes [Eq] filters may name. The tenant
	// filter needs none: it is always available.
	Filterable []string
	// Sortable are the attributes a [Query] may sort by.
	Sortable []string
	// Shared says the documents belong to no tenant: every search sees
	// them all. The default (false) is tenant-owned documents: each
	// document belongs to the tenant of the event that wrote it, and a
	// search sees only the documents of the tenant in its context
	// ([WithTenant]).
	Shared bool
}

// namePattern keeps index names usable as a Meilisearch uid and inside a
// PostgreSQL identifier without quoting surprises.
var namePattern = regexp.MustCompile(`^[a-z][a-z0-9_]{0,39}$`)

// attrPattern keeps attribute names usable in a Meilisearch filter
// expression and as part of a PostgreSQL column name.
var attrPattern = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,50}$`)

// reservedPrefix marks attributes the backends add to stored documents
// (the tenant, a composite key); a document may not use it.
const reservedPrefix = "projector_"

// withDefaults returns idx with its primary key filled in.
func (idx Index) withDefaults() Index {
	idx.PrimaryKey = cmp.Or(idx.PrimaryKey, DefaultPrimaryKey)
	idx.Searchable = slices.Clone(idx.Searchable)
	idx.Filterable = slices.Clone(idx.Filterable)
	idx.Sortable = slices.Clone(idx.Sortable)
	return idx
}

// Validate reports what is wrong with the declaration, or nil.
func (idx Index) Validate() error {
	idx = idx.withDefaults()
	if !namePattern.MatchString(idx.Name) {
		return fmt.Errorf("%w: name %q: want lower-case letters, digits and _, starting with a letter, at most 40", ErrInvalidIndex, idx.Name)
	}
	if err := validAttr(idx.PrimaryKey); err != nil {
		return fmt.Errorf("%w %q: primary key: %w", ErrInvalidIndex, idx.Name, err)
	}
	for _, list := range []struct {
		what  string
		attrs []string
	}{{"searchable", idx.Searchable}, {"filterable", idx.Filterable}, {"sortable", idx.Sortable}} {
		seen := map[string]bool{}
		for _, a := range list.attrs {
			if err := validAttr(a); err != nil {
				return fmt.Errorf("%w %q: %s attribute: %w", ErrInvalidIndex, idx.Name, list.what, err)
			}
			if seen[a] {
				return fmt.Errorf("%w %q: %s attribute %q listed twice", ErrInvalidIndex, idx.Name, list.what, a)
			}
			seen[a] = true
		}
	}
	return nil
}

func validAttr(a string) error {
	switch {
	case !attrPattern.MatchString(a):
		return fmt.Errorf("attribute %q: want letters, digits and _, starting with a letter or _, at most 51", a)
	case len(a) >= len(reservedPrefix) && a[:len(reservedPrefix)] == reservedPrefix:
		return fmt.Errorf("attribute %q: the prefix %q is reserved for Projector's own attributes", a, reservedPrefix)
	}
	return nil
}

// Filter is one condition of a search or a delete: the attribute equals
// the value (or, for an array attribute, one of its elements does).
// Conditions of one call are combined with AND.
type Filter struct {
	Attr  string
	Value any
}

// Eq returns the filter attr = value. value is a string, a number or a
// boolean; attr must be declared in [Index.Filterable].
func Eq(attr string, value any) Filter { return Filter{Attr: attr, Value: value} }

// JSON returns the filter's value as JSON, the form both backends compare.
func (f Filter) JSON() (json.RawMessage, error) {
	switch v := f.Value.(type) {
	case string:
		// encoding/json would turn invalid UTF-8 into U+FFFD (matching
		// something else) and PostgreSQL's jsonb refuses \u0000.
		if err := projector.ValidText(v); err != nil {
			return nil, fmt.Errorf("%w: %s: the value %s %w", ErrInvalidFilter, f.Attr, projector.Printable(v), err)
		}
	case bool, int, int8, int16, int32, int64, uint, uint8, uint16, uint32, uint64, float32, float64, json.Number:
	default:
		return nil, fmt.Errorf("%w: %s: value of type %T; want a string, number or boolean", ErrInvalidFilter, f.Attr, f.Value)
	}
	b, err := json.Marshal(f.Value)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrInvalidFilter, f.Attr, err)
	}
	return b, nil
}

// checkFilters checks filters against the index's filterable attributes.
func (idx Index) checkFilters(filters []Filter) error {
	for _, f := range filters {
		if !slices.Contains(idx.Filterable, f.Attr) {
			return fmt.Errorf("%w: attribute %q is not filterable in index %q (declare it in Index.Filterable)", ErrInvalidFilter, f.Attr, idx.Name)
		}
		if _, err := f.JSON(); err != nil {
			return err
		}
	}
	return nil
}

// documentID returns a document's primary key as a string: a JSON string
// as is, an integer in decimal.
func documentID(doc map[string]json.RawMessage, key string) (string, error) {
	raw, ok := doc[key]
	if !ok {
		return "", fmt.Errorf("%w: no primary key attribute %q", ErrInvalidDocument, key)
	}
	return idFromJSON(raw, key)
}

func idFromJSON(raw json.RawMessage, key string) (string, error) {
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		if s == "" {
			return "", fmt.Errorf("%w: empty primary key %q", ErrInvalidDocument, key)
		}
		return s, checkID(s)
	}
	var n json.Number
	if err := json.Unmarshal(raw, &n); err == nil {
		if i, err := strconv.ParseInt(n.String(), 10, 64); err == nil {
			return strconv.FormatInt(i, 10), nil
		}
	}
	return "", fmt.Errorf("%w: primary key %q is %s; want a string or an integer", ErrInvalidDocument, key, raw)
}

// checkID refuses a document id no backend can key a document by: one over
// [projector.MaxNameLength] bytes, not valid UTF-8 or holding a NUL (which
// PostgreSQL refuses when the batch is written, failing the shard's batch
// again and again instead of the handler's one call).
func checkID(id string) error {
	if len(id) > projector.MaxNameLength || projector.ValidText(id) != nil {
		return fmt.Errorf("%w: document id %s is not storable (valid UTF-8 without NUL, at most %d bytes)", ErrInvalidDocument, projector.Printable(id), projector.MaxNameLength)
	}
	return nil
}
