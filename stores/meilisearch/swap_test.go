package meilisearch_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/projectorhq/projector/search"
	"github.com/projectorhq/projector/stores/meilisearch"
	"github.com/projectorhq/projector/stores/meilisearch/meilisearchtest"
)

var swapIndex = search.Index{Name: "docs", Searchable: []string{"title"}}

func upsert(t *testing.T, b search.Backend, id, title string) {
	t.Helper()
	doc := map[string]json.RawMessage{"id": json.RawMessage(`"` + id + `"`), "title": json.RawMessage(`"` + title + `"`)}
	if err := b.Apply(context.Background(), nil, swapIndex, []search.Op{{Kind: search.OpUpsert, Tenant: "acme", ID: id, Doc: doc}}); err != nil {
		t.Fatal(err)
	}
}

func titles(t *testing.T, b *meilisearch.Backend) []string {
	t.Helper()
	docs, err := b.Documents(context.Background(), swapIndex)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, d := range docs {
		var v struct{ Title string }
		if err := json.Unmarshal(d.Doc, &v); err != nil {
			t.Fatal(err)
		}
		out = append(out, v.Title)
	}
	return out
}

// TestSwapRebuildNeverSwapsBack: SwapRebuild may run again after a crash
// at any point (after the swap task succeeded, before the old index was
// deleted; after both), from any dispatcher. Every repetition leaves the
// new index live: it recognises the earlier swap from the task list (the
// shadow uid is unique to the rebuild) or from the shadow being gone,
// instead of swapping the two back.
func TestSwapRebuildNeverSwapsBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	fake := meilisearchtest.New(t)
	b, err := meilisearch.New(meilisearch.Config{URL: fake.URL(), PollInterval: 2 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Ensure(ctx, swapIndex); err != nil {
		t.Fatal(err)
	}
	upsert(t, b, "1", "old")
	const rebuildID = 7
	if err := b.PrepareRebuild(ctx, swapIndex, rebuildID); err != nil {
		t.Fatal(err)
	}
	upsert(t, b.RebuildShadow(rebuildID), "1", "new")
	live, shadow := b.UID(swapIndex), b.UID(swapIndex)+"__rebuild_7"

	// A crash right after the swap task succeeded: swapped, the old index
	// (now under the shadow's uid) not yet deleted.
	body, _ := json.Marshal([]map[string]any{{"indexes": []string{live, shadow}}})
	resp, err := http.Post(fake.URL()+"/swap-indexes", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	deadline := time.Now().Add(10 * time.Second)
	for got := titles(t, b); len(got) != 1 || got[0] != "new"; got = titles(t, b) {
		if time.Now().After(deadline) {
			t.Fatalf("the manual swap did not happen: %v", got)
		}
		time.Sleep(2 * time.Millisecond) // polling the fake's task queue
	}
	for i := range 3 {
		if err := b.SwapRebuild(ctx, swapIndex, rebuildID); err != nil {
			t.Fatalf("SwapRebuild run %d: %v", i+1, err)
		}
		if got := titles(t, b); len(got) != 1 || got[0] != "new" {
			t.Fatalf("after SwapRebuild run %d the live index holds %v, want the new document: it swapped back", i+1, got)
		}
		if exists, _ := fake.Index(shadow); exists {
			t.Fatalf("after SwapRebuild run %d the old index %s is still there", i+1, shadow)
		}
	}
	if n := fake.Requests("POST /swap-indexes"); n != 1 {
		t.Fatalf("%d swap requests in all, want only the first", n)
	}

	// A fresh rebuild swaps once, and dropping a cancelled one's shadow is
	// idempotent.
	if err := b.PrepareRebuild(ctx, swapIndex, 8); err != nil {
		t.Fatal(err)
	}
	upsert(t, b.RebuildShadow(8), "1", "newer")
	if err := b.SwapRebuild(ctx, swapIndex, 8); err != nil {
		t.Fatal(err)
	}
	if got := titles(t, b); len(got) != 1 || got[0] != "newer" {
		t.Fatalf("after rebuild 8's swap the live index holds %v", got)
	}
	for range 2 {
		if err := b.DropRebuild(ctx, swapIndex, 9); err != nil {
			t.Fatalf("DropRebuild of a shadow that does not exist: %v", err)
		}
	}
}
