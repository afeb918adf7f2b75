package pgsearch_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/search"
	"github.com/projectorhq/projector/stores/pgsearch"
)

// TestQueryCostIsBounded: a query's text is capped in bytes and words
// with search.ErrQueryTooLarge, checked before PostgreSQL sees it, through
// search.Search and through the backend directly. A 1 MiB query once ran
// for 6–35 s and ended in "stack depth limit exceeded"; now it is refused
// at once. A query of search.MaxQueryTerms words still finds its document.
func TestQueryCostIsBounded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := pgtest.Store(t, projector.NewRegistry())
	b, err := pgsearch.New(store, pgsearch.Config{})
	if err != nil {
		t.Fatal(err)
	}
	idx := search.Index{Name: "tickets", Searchable: []string{"title"}}
	if err := b.Ensure(ctx, idx); err != nil {
		t.Fatal(err)
	}
	words := make([]string, search.MaxQueryTerms)
	for i := range words {
		words[i] = fmt.Sprintf("w%d", i)
	}
	title, _ := json.Marshal(strings.Join(words, " "))
	apply(t, store.Pool(), b, idx, search.Op{Kind: search.OpUpsert, Tenant: "acme", ID: "T-1",
		Doc: map[string]json.RawMessage{"id": json.RawMessage(`"T-1"`), "title": title}})
	acme := search.WithTenant(ctx, "acme")

	got, err := search.Search[map[string]any](acme, search.Target(b, idx), strings.Join(words, " "))
	if err != nil || len(got) != 1 {
		t.Fatalf("a query of %d words: %v, %v", search.MaxQueryTerms, got, err)
	}
	for name, text := range map[string]string{
		"1 MiB of words":              strings.Repeat("printer ", 1<<17),
		"1 MiB of one letter":         strings.Repeat("a", 1<<20),
		"one word too many":           strings.Join(words, " ") + " w99",
		"one byte too long":           strings.Repeat("a", search.MaxQueryBytes+1),
		"punctuation between words":   strings.Repeat("a&", search.MaxQueryTerms+1),
		"words in a non-Latin script": strings.Repeat("печать ", search.MaxQueryTerms+1),
	} {
		start := time.Now()
		_, err := search.Search[map[string]any](acme, search.Target(b, idx), text)
		if !errors.Is(err, search.ErrQueryTooLarge) {
			t.Fatalf("%s through search.Search: %v, want search.ErrQueryTooLarge", name, err)
		}
		if strings.Contains(err.Error(), text[:min(len(text), 200)]) {
			t.Fatalf("%s: the error echoes the query: %.300s", name, err)
		}
		_, err = b.Query(ctx, idx, search.Request{Query: search.Query{Text: text, Limit: 10}, Tenant: "acme"})
		if !errors.Is(err, search.ErrQueryTooLarge) {
			t.Fatalf("%s through Backend.Query: %v, want search.ErrQueryTooLarge", name, err)
		}
		if took := time.Since(start); took > 2*time.Second {
			t.Fatalf("%s: refused after %v; the check must come before any work", name, took)
		}
	}
}

// TestFilterValuesArePostgreSQLText: a filter value PostgreSQL cannot
// hold (a NUL byte, invalid UTF-8) is search.ErrInvalidFilter before it
// is sent, for searches and for deletes by filter. "op\x00en" once
// reached PostgreSQL as "unsupported Unicode escape sequence (22P05)".
func TestFilterValuesArePostgreSQLText(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := pgtest.Store(t, projector.NewRegistry())
	b, err := pgsearch.New(store, pgsearch.Config{})
	if err != nil {
		t.Fatal(err)
	}
	idx := search.Index{Name: "tickets", Searchable: []string{"title"}, Filterable: []string{"status"}}
	if err := b.Ensure(ctx, idx); err != nil {
		t.Fatal(err)
	}
	acme := search.WithTenant(ctx, "acme")
	for _, v := range []string{"op\x00en", "op\xffen", "\xc3"} {
		if _, err := search.Search[map[string]any](acme, search.Target(b, idx), "", search.Eq("status", v)); !errors.Is(err, search.ErrInvalidFilter) {
			t.Fatalf("search.Eq(status, %q): %v, want search.ErrInvalidFilter", v, err)
		}
		if _, err := search.Eq("status", v).JSON(); !errors.Is(err, search.ErrInvalidFilter) {
			t.Fatalf("Filter.JSON of %q: %v, want search.ErrInvalidFilter", v, err)
		}
		tx, err := store.Pool().Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		err = b.Apply(ctx, tx, idx, []search.Op{{Kind: search.OpDeleteWhere, Tenant: "acme", Filters: []search.Filter{search.Eq("status", v)}}})
		_ = tx.Rollback(ctx)
		if !errors.Is(err, search.ErrInvalidFilter) {
			t.Fatalf("delete where status = %q: %v, want search.ErrInvalidFilter", v, err)
		}
	}
}
