package postgres_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/stores/postgres"
)

// seqScans lists the relations a JSON plan reads with a sequential scan.
func seqScans(t *testing.T, plan string) []string {
	t.Helper()
	var nodes []map[string]any
	if err := json.Unmarshal([]byte(plan), &nodes); err != nil {
		t.Fatal(err)
	}
	var out []string
	var walk func(n map[string]any)
	walk = func(n map[string]any) {
		if n["Node Type"] == "Seq Scan" {
			out = append(out, fmt.Sprint(n["Relation Name"]))
		}
		for _, k := range []string{"Plan", "Plans"} {
			switch c := n[k].(type) {
			case map[string]any:
				walk(c)
			case []any:
				for _, x := range c {
					if m, ok := x.(map[string]any); ok {
						walk(m)
					}
				}
			}
		}
	}
	for _, n := range nodes {
		walk(n)
	}
	return out
}

// What a prune runs on the events table while it holds the consumers
// table in SHARE mode (which every dispatcher's cursor write waits for)
// must not read the whole log: on a log of 20,000 aggregate events and
// 2,000 old session events (a batch of thousands of keys, which the planner
// could hash-join against the whole log), no statement under the lock
// scans projector_events.
// Without an index serving the prune's filter each one did, so the stall
// grew with the log.
func TestPruneUnderLockReadsNoWholeLog(t *testing.T) {
	t.Parallel()
	f := pruneSetup(t)
	payloads := make([]any, 100)
	for i := range payloads {
		payloads[i] = testevents.TicketCommented{Body: "c"}
	}
	if err := pgx.BeginFunc(f.ctx, f.store.Pool(), func(tx pgx.Tx) error {
		for i := range 200 {
			if _, err := f.store.Append(f.ctx, tx, projector.Stream("ticket", fmt.Sprint(i)), projector.NoStream, payloads...); err != nil {
				return err
			}
			if _, err := f.store.Append(f.ctx, tx, projector.Stream("session", fmt.Sprint(i)), projector.NoStream, payloads[:10]...); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.store.Pool().Exec(f.ctx, `ANALYZE `+f.store.Table("projector_events")); err != nil {
		t.Fatal(err)
	}
	plans, err := f.store.ExplainPruneLocked(context.Background(), []string{"session"}, time.Now().Add(time.Hour), 10_000)
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range plans {
		for _, rel := range seqScans(t, p) {
			if rel == "projector_events" {
				t.Errorf("statement %d a prune runs under the lock scans the whole log:\n%s", i, p)
			}
		}
	}
}

// Promise 9 with the other actor in the gap between a batch's choice and
// the lock: a consumer that had passed every candidate is rewound to the
// start (as an in-place rebuild does) after the prune chose its rows and
// before it locked the consumers table. The guard is read under the lock,
// so the rewound consumer still blocks the prune: nothing it needs goes.
func TestPromise9_ConsumerRewoundBetweenChoiceAndLock(t *testing.T) {
	t.Parallel()
	f := pruneSetup(t)
	var last projector.Position
	for i := range 5 {
		res := f.appendTx(t, projector.Stream("session", fmt.Sprint(i)), projector.NoStream, testevents.TicketOpened{Title: "x"})
		last = res.Events[0].Position
	}
	f.consumer(t, "live", last, "idle")
	rewind, err := f.store.Pool().Begin(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rewind.Rollback(f.ctx) }()
	if _, err := rewind.Exec(f.ctx, `UPDATE `+f.store.Table("projector_consumers")+` SET cursor_tx_id = '0', cursor_seq = 0 WHERE name = 'live'`); err != nil {
		t.Fatal(err)
	}
	type result struct {
		res postgres.PruneResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := f.store.Prune(f.ctx, postgres.PruneOptions{OlderThan: tiny})
		done <- result{res, err}
	}()
	// The prune has chosen its rows (the consumer, as committed, had passed
	// them all) and waits for the lock.
	pgtest.WaitForLockOn(t, f.store.Pool(), f.store.Table("projector_consumers"))
	if err := rewind.Commit(f.ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.res.Deleted != 0 || r.res.HeldBack != 5 || r.res.Blocker == nil || r.res.Blocker.Consumer != "live" {
		t.Fatalf("prune with a consumer rewound in its gap: %+v (blocker %+v)", r.res, r.res.Blocker)
	}
	if n := f.remaining(t, "session"); n != 5 {
		t.Fatalf("%d events left; the rewound consumer needs all 5", n)
	}
}
