package search

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"unicode"

	"github.com/projectorhq/projector"
)

// ErrNoTenant: a search of a tenant-owned index was made with no tenant in
// its context. Searches fail closed: without a tenant nothing is returned,
// rather than everybody's documents.
var ErrNoTenant = errors.New("search: no tenant in the context of a search of a tenant-owned index (use search.WithTenant)")

// ErrQueryTooLarge: a query's text is longer than [MaxQueryBytes] or
// holds more than [MaxQueryTerms] words. Every word is a condition the
// backend must meet (PostgreSQL ANDs one prefix match per word), so an
// unbounded query is an unbounded cost: a megabyte of words once ran for
// half a minute and ended in PostgreSQL's stack depth limit. The error
// never carries the query's text.
var ErrQueryTooLarge = errors.New("search: query too large")

// Defaults and limits of [Query].
const (
	DefaultLimit = 20
	MaxLimit     = 1000
	// MaxQueryBytes caps the length of [Query.Text] in bytes.
	MaxQueryBytes = 2048
	// MaxQueryTerms caps the words of [Query.Text], as [QueryTerms]
	// splits them.
	MaxQueryTerms = 32
)

// Query is what a search asks for.
type Query struct {
	// Text is the full-text query; empty matches every document (then the
	// filters alone select).
	Text string
	// Filters must all hold; their attributes must be filterable.
	Filters []Filter
	// Sort orders the hits by sortable attributes, first first; without it
	// hits come by relevance.
	Sort []Sort
	// Limit caps the hits, default [DefaultLimit], at most [MaxLimit].
	Limit int
	// Offset skips that many hits, for paging.
	Offset int
}

// Sort orders hits by one sortable attribute.
type Sort struct {
	Attr string
	Desc bool
}

type tenantKey struct{}

// WithTenant returns a context whose searches see only tenant's documents
// in tenant-owned indexes. Set it where the request's tenant is known (the
// authentication middleware), so no search can forget it.
func WithTenant(ctx context.Context, tenant string) context.Context {
	return context.WithValue(ctx, tenantKey{}, tenant)
}

// TenantFrom returns the tenant [WithTenant] put in ctx.
func TenantFrom(ctx context.Context) (string, bool) {
	t, ok := ctx.Value(tenantKey{}).(string)
	return t, ok && t != ""
}

// Source is an index on a backend: a [*Projection], or [Target] for a process
// that searches an index without running its projection.
type Source interface {
	SearchIndex() Index
	SearchBackend() Backend
}

type source struct {
	idx Index
	b   Backend
}

func (s source) SearchIndex() Index     { return s.idx }
func (s source) SearchBackend() Backend { return s.b }

// Target returns idx on backend b as a [Source].
func Target(b Backend, idx Index) Source { return source{idx: idx.withDefaults(), b: b} }

// Search returns the documents of src matching text and all filters,
// decoded as T, most relevant first. In a tenant-owned index only the
// documents of the context's tenant ([WithTenant]) are searched, on every
// backend; without a tenant it fails with [ErrNoTenant].
func Search[T any](ctx context.Context, src Source, text string, filters ...Filter) ([]T, error) {
	return SearchQuery[T](ctx, src, Query{Text: text, Filters: filters})
}

// SearchQuery is [Search] with sorting and paging.
func SearchQuery[T any](ctx context.Context, src Source, q Query) ([]T, error) {
	idx, b := src.SearchIndex().withDefaults(), src.SearchBackend()
	req, err := request(ctx, idx, q)
	if err != nil {
		return nil, err
	}
	raw, err := b.Query(ctx, idx, req)
	if err != nil {
		return nil, fmt.Errorf("search %s index %q: %w", b.Kind(), idx.Name, err)
	}
	out := make([]T, 0, len(raw))
	for _, doc := range raw {
		var v T
		if err := json.Unmarshal(doc, &v); err != nil {
			return nil, fmt.Errorf("search %s index %q: decode a document as %T: %w", b.Kind(), idx.Name, v, err)
		}
		out = append(out, v)
	}
	return out, nil
}

// QueryTerms returns the words of a query's text as the backends match
// them: runs of letters and digits, everything else separating them. Text
// longer than [MaxQueryBytes] or of more than [MaxQueryTerms] words is
// [ErrQueryTooLarge], found without splitting more than the limit allows.
func QueryTerms(text string) ([]string, error) {
	if len(text) > MaxQueryBytes {
		return nil, fmt.Errorf("%w: the text is %d bytes, more than %d", ErrQueryTooLarge, len(text), MaxQueryBytes)
	}
	var terms []string
	start := -1
	for i, r := range text {
		inWord := unicode.IsLetter(r) || unicode.IsDigit(r)
		switch {
		case inWord && start < 0:
			start = i
		case !inWord && start >= 0:
			terms, start = append(terms, text[start:i]), -1
		}
		if len(terms) > MaxQueryTerms {
			return nil, fmt.Errorf("%w: the text holds more than %d words", ErrQueryTooLarge, MaxQueryTerms)
		}
	}
	if start >= 0 {
		terms = append(terms, text[start:])
	}
	if len(terms) > MaxQueryTerms {
		return nil, fmt.Errorf("%w: the text holds more than %d words", ErrQueryTooLarge, MaxQueryTerms)
	}
	return terms, nil
}

// request checks q and adds the tenant filter.
func request(ctx context.Context, idx Index, q Query) (Request, error) {
	if _, err := QueryTerms(q.Text); err != nil {
		return Request{}, fmt.Errorf("search index %q: %w", idx.Name, err)
	}
	if q.Limit == 0 {
		q.Limit = DefaultLimit
	}
	if q.Limit < 0 || q.Limit > MaxLimit || q.Offset < 0 {
		return Request{}, fmt.Errorf("search index %q: limit %d / offset %d: want a limit of 1..%d and a non-negative offset", idx.Name, q.Limit, q.Offset, MaxLimit)
	}
	if err := idx.checkFilters(q.Filters); err != nil {
		return Request{}, err
	}
	for _, s := range q.Sort {
		if !slices.Contains(idx.Sortable, s.Attr) {
			return Request{}, fmt.Errorf("%w: attribute %q is not sortable in index %q (declare it in Index.Sortable)", ErrInvalidFilter, s.Attr, idx.Name)
		}
	}
	req := Request{Query: q}
	if !idx.Shared {
		tenant, ok := TenantFrom(ctx)
		if !ok {
			return Request{}, fmt.Errorf("search index %q: %w", idx.Name, ErrNoTenant)
		}
		if err := projector.TenantStream(tenant, "search", "search").Validate(); err != nil {
			return Request{}, fmt.Errorf("search index %q: tenant: %w", idx.Name, err)
		}
		req.Tenant = tenant
	}
	return req, nil
}
