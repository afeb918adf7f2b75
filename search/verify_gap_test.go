package search_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/search"
)

// gapBackend holds a dispatcher batch in the gap between its write to the
// index and its commit: once armed, the next Apply writes, closes the
// gate's written and returns only once its release is closed. onList,
// when set, runs after every listing of the index with how many there
// were since arming.
type gapBackend struct {
	search.Backend
	gate   atomic.Pointer[gate]
	listed atomic.Int64
	onList func(n int64)
}

type gate struct{ written, release chan struct{} }

// arm holds the next batch in the gap; written is closed once it wrote,
// and release (idempotent) lets it commit.
func (g *gapBackend) arm() (written <-chan struct{}, release func()) {
	gt := &gate{written: make(chan struct{}), release: make(chan struct{})}
	var once sync.Once
	g.listed.Store(0)
	g.gate.Store(gt)
	return gt.written, func() { once.Do(func() { close(gt.release) }) }
}

func (g *gapBackend) Apply(ctx context.Context, tx pgx.Tx, idx search.Index, ops []search.Op) error {
	if err := g.Backend.Apply(ctx, tx, idx, ops); err != nil {
		return err
	}
	if gt := g.gate.Swap(nil); gt != nil {
		close(gt.written)
		select {
		case <-gt.release:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

func (g *gapBackend) Documents(ctx context.Context, idx search.Index) ([]search.Stored, error) {
	docs, err := g.Backend.(search.Lister).Documents(ctx, idx)
	if hook := g.onList; hook != nil {
		hook(g.listed.Add(1))
	}
	return docs, err
}

func (g *gapBackend) EachDocument(ctx context.Context, idx search.Index, fn func(search.Stored) error) error {
	var err error
	if s, ok := g.Backend.(search.DocumentStreamer); ok {
		err = s.EachDocument(ctx, idx, fn)
	} else {
		var docs []search.Stored
		if docs, err = g.Backend.(search.Lister).Documents(ctx, idx); err == nil {
			for _, d := range docs {
				if err = fn(d); err != nil {
					break
				}
			}
		}
	}
	if hook := g.onList; hook != nil {
		hook(g.listed.Add(1))
	}
	return err
}

// TestVerifyBatchInTheGap: a batch has written its documents to the index
// and not yet committed its cursor (held there by the backend) while
// Verify reads the cursor, the index and the cursor again. On Meilisearch
// the index then holds a document the unmoved cursor does not explain:
// Verify reported it as extra (exit 1 from the CLI) though nothing was
// wrong. It must see the batch in flight, read again once it committed,
// and pass; a document tampered with behind the projection's back must
// still be reported, alone, with a batch in the same gap. pgsearch writes
// in the batch's transaction, so its index never runs ahead of the cursor:
// the same test passes on it. Partitioned, the batch is one partition's,
// and the lock Verify looks at that partition's.
//
// Released: the batch commits while Verify reads again (at its second
// read of the index). Held: it stays in the gap through every attempt,
// and Verify, left with a read that differs, reads the page again holding
// the consumer: it waits for the batch, which the test lets commit once
// Verify waits for the shard's lock, and the answer is exact.
func TestVerifyBatchInTheGap(t *testing.T) {
	for _, bc := range backends() {
		for _, parts := range []int{0, 2} {
			for _, held := range []bool{false, true} {
				mode := map[bool]string{false: "released", true: "held"}[held]
				t.Run(fmt.Sprintf("%s/partitions=%d/%s", bc.name, parts, mode), func(t *testing.T) {
					t.Parallel()
					testVerifyBatchInTheGap(t, bc, parts, held)
				})
			}
		}
	}
}

func testVerifyBatchInTheGap(t *testing.T, bc backendCase, parts int, held bool) {
	e := newEnv(t)
	if parts > 0 {
		must(t, e.store.CreatePartitionIndex(e.ctx))
	}
	inner := bc.make(e)
	g := &gapBackend{Backend: inner}
	p := e.ticketProjection("ticket_search", g, projection.AsyncConfig{Partitions: parts})
	d := e.dispatcher(p)
	e.append("acme", "T-1", testevents.TicketOpened{Title: "first"})
	e.append("acme", "T-2", testevents.TicketOpened{Title: "second"})
	e.catchUp(d)
	shards := []string{projection.SharedInstance}
	for i := range parts {
		shards = append(shards, projection.PartitionInstance(i, parts))
	}

	round := 0
	verifyInTheGap := func() search.VerifyReport {
		t.Helper()
		round++
		written, release := g.arm()
		defer release()
		e.append("acme", fmt.Sprintf("T-gap-%d", round), testevents.TicketOpened{Title: "in the gap"})
		select {
		case <-written:
		case <-time.After(30 * time.Second):
			t.Fatal("the batch never wrote to the index")
		}
		if !held {
			// Listings: Verify's count of the index, its first read (the
			// batch in the gap), its second: only then may the batch
			// commit, and the hook waits until it has. Verify reads on
			// after that.
			g.onList = func(n int64) {
				if n == 3 {
					release()
					e.catchUp(d)
				}
			}
			defer func() { g.onList = nil }()
			report, err := search.Verify(e.ctx, e.store, p, search.VerifyOptions{})
			must(t, err)
			return report
		}
		type result struct {
			report search.VerifyReport
			err    error
		}
		done := make(chan result, 1)
		go func() {
			r, err := search.Verify(e.ctx, e.store, p, search.VerifyOptions{})
			done <- result{r, err}
		}()
		var r result
		eventually(t, 30*time.Second, "verify to wait for the consumer's lock, or to return", func() bool {
			select {
			case r = <-done:
				return true
			default:
			}
			if e.shardLockWaited("ticket_search", shards) {
				release()
				r = <-done
				return true
			}
			return false
		})
		must(t, r.err)
		return r.report
	}

	report := verifyInTheGap()
	if !report.OK() {
		t.Fatalf("verify with a batch between its index write and its commit: OK %v, moved %v, %d expected, %d indexed; differences %+v",
			report.OK(), report.Moved, report.Expected, report.Indexed, report.Differences)
	}
	if report.Indexed < 2 {
		t.Fatalf("verify found %d documents indexed, want at least the 2 before the batch", report.Indexed)
	}

	raw := func(v any) json.RawMessage { return mustJSON(t, v) }
	tamper := []search.Op{{Kind: search.OpPatch, Tenant: "acme", ID: "T-1", Doc: map[string]json.RawMessage{"title": raw("tampered")}}}
	must(t, pgx.BeginFunc(e.ctx, e.store.Pool(), func(tx pgx.Tx) error { return inner.Apply(e.ctx, tx, ticketIndex, tamper) }))
	report = verifyInTheGap()
	if report.OK() || len(report.Differences) != 1 {
		t.Fatalf("verify of a tampered index with a batch in the gap: OK %v, differences %+v; want the tampered document alone",
			report.OK(), report.Differences)
	}
	if diff := report.Differences[0]; diff.Kind != search.Differs || diff.Tenant != "acme" || diff.ID != "T-1" {
		t.Fatalf("difference %+v, want acme/T-1 differs", diff)
	}
	if held && report.Moved {
		t.Fatal("verify, having read the page with the consumer held, still says the consumer moved")
	}
}

// shardLockWaited reports whether some session waits for the advisory lock
// of one of consumer's shards instances (the dispatcher's key).
func (e *env) shardLockWaited(consumer string, instances []string) bool {
	e.t.Helper()
	keys := make([]string, len(instances))
	for i, inst := range instances {
		keys[i] = "projector.shard\x1f" + e.store.Schema() + "\x1f" + consumer + "\x1f" + inst
	}
	var n int
	must(e.t, e.store.Pool().QueryRow(e.ctx, `SELECT count(*) FROM pg_locks
		WHERE locktype = 'advisory' AND NOT granted AND objsubid = 1
		  AND ((classid::bigint << 32) | objid::bigint) = ANY (SELECT hashtextextended(k, 0) FROM unnest($1::text[]) k)`, keys).Scan(&n))
	return n > 0
}
