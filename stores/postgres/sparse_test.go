package postgres_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/stores/postgres"
)

// planNode is the part of EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) that
// counts rows and pages.
type planNode struct {
	NodeType      string     `json:"Node Type"`
	SharedHit     float64    `json:"Shared Hit Blocks"`
	SharedRead    float64    `json:"Shared Read Blocks"`
	ActualRows    float64    `json:"Actual Rows"`
	ActualLoops   float64    `json:"Actual Loops"`
	RemovedFilter float64    `json:"Rows Removed by Filter"`
	Plans         []planNode `json:"Plans"`
}

// rowsScanned sums the rows every scan of the plan read, kept or filtered
// out: what a read costs, whatever the machine's speed.
func rowsScanned(n planNode) float64 {
	total := 0.0
	switch n.NodeType {
	case "Seq Scan", "Index Scan", "Index Only Scan", "Bitmap Heap Scan":
		total += (n.ActualRows + n.RemovedFilter) * max(n.ActualLoops, 1)
	}
	for _, c := range n.Plans {
		total += rowsScanned(c)
	}
	return total
}

// A consumer of a few event types reads what it returns, not the log it
// skips: over a log of 50 interleaved types, catching up on 1 of them (and
// on 3) scans at most a small multiple of the events delivered, counted
// from the executed plans. A scan of the log filtered by type read about 50
// events for every one it returned (15,443 rows for 400).
func TestFilteredReadCostsWhatItReturns(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := pgtest.Store(t, testevents.New().Registry)
	const types, events = 50, 20_000
	for tx := range events / 100 { // 100 events a transaction, as appends would write them
		if _, err := store.Pool().Exec(ctx, `INSERT INTO `+store.Table("projector_events")+`
				(id, tenant_id, stream_type, stream_id, version, type, schema_version, data, correlation_id)
			SELECT gen_random_uuid(), $1, 'load', 's' || g, 1, 'load.t' || (g % $2), 1, '{}', gen_random_uuid()
			FROM generate_series($3::int, $3::int + 99) g`, projector.SystemTenant, types, tx*100); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := store.Pool().Exec(ctx, `ANALYZE `+store.Table("projector_events")); err != nil {
		t.Fatal(err)
	}
	waitHorizonPast(t, store)
	for _, wanted := range [][]string{{"load.t7"}, {"load.t3", "load.t7", "load.t7", "load.t41"}} {
		t.Run(fmt.Sprint(wanted), func(t *testing.T) {
			var returned, scanned float64
			cursor := projector.Start
			var last projector.Position
			for {
				q := postgres.LogQuery{After: cursor, Limit: 100, EventTypes: wanted, Raw: true}
				raw, err := store.ExplainReadLog(ctx, q)
				if err != nil {
					t.Fatal(err)
				}
				var plans []struct{ Plan planNode }
				if err := json.Unmarshal(raw, &plans); err != nil {
					t.Fatal(err)
				}
				scanned += rowsScanned(plans[0].Plan)
				batch, err := store.ReadLog(ctx, q)
				if err != nil {
					t.Fatal(err)
				}
				for _, ev := range batch.Events {
					if !last.Less(ev.Position) {
						t.Fatalf("events out of log order or repeated: %s after %s", ev.Position, last)
					}
					last = ev.Position
				}
				returned += float64(len(batch.Events))
				cursor = batch.Next(cursor)
				if !batch.Full {
					break
				}
			}
			distinct := map[string]bool{}
			for _, w := range wanted {
				distinct[w] = true
			}
			if want := float64(events / types * len(distinct)); returned != want {
				t.Fatalf("returned %v events of %v, want %v", returned, wanted, want)
			}
			// The planner may read a type's few remaining events whole
			// (bitmap scan and sort) rather than in order: still a small
			// multiple, never the log in between.
			if scanned > 8*returned {
				t.Fatalf("catching up on %v scanned %v rows to return %v", wanted, scanned, returned)
			}
			t.Logf("%v: %v events returned, %v rows scanned", wanted, returned, scanned)
		})
	}
}

// A batch read deep in the log costs what one at its start costs: the index
// descent lands on the cursor. Written as one row comparison over (type,
// tx_id, seq) beside type = $t, PostgreSQL 15 started the scan at the
// type's first entry and stepped over every index entry before the cursor,
// so each batch cost its position and a catch-up the square of the log. The
// pages a read touches (EXPLAIN's shared buffers, not a timer) count it: a
// batch near the end of 20,000 events of one type touched over 100 pages
// that way, against under ten at the start.
func TestReadLogCostDoesNotGrowWithPosition(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := pgtest.Store(t, testevents.New().Registry)
	const events = 20_000
	for tx := range events / 1000 {
		if _, err := store.Pool().Exec(ctx, `INSERT INTO `+store.Table("projector_events")+`
				(id, tenant_id, stream_type, stream_id, version, type, schema_version, data, correlation_id)
			SELECT gen_random_uuid(), $1, 'load', 's' || g, 1, 'load.one', 1, '{}', gen_random_uuid()
			FROM generate_series($2::int, $2::int + 999) g`, projector.SystemTenant, tx*1000); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := store.Pool().Exec(ctx, `ANALYZE `+store.Table("projector_events")); err != nil {
		t.Fatal(err)
	}
	waitHorizonPast(t, store)
	var near projector.Position
	if err := store.Pool().QueryRow(ctx, `SELECT tx_id, seq FROM `+store.Table("projector_events")+
		` ORDER BY tx_id, seq OFFSET $1 LIMIT 1`, events-500).Scan(&near.TxID, &near.Seq); err != nil {
		t.Fatalf("position near the end: %v", err)
	}
	pages := func(after projector.Position) float64 {
		// A few consumers of this type and of several, each read twice:
		// the first execution may still be planning with fresh statistics.
		var most float64
		for _, types := range [][]string{{"load.one"}, {"load.one", "load.other"}} {
			for range 2 {
				raw, err := store.ExplainReadLog(ctx, postgres.LogQuery{After: after, Limit: 100, EventTypes: types, Raw: true})
				if err != nil {
					t.Fatal(err)
				}
				var plans []struct{ Plan planNode }
				if err := json.Unmarshal(raw, &plans); err != nil {
					t.Fatal(err)
				}
				most = max(most, plans[0].Plan.SharedHit+plans[0].Plan.SharedRead)
			}
		}
		return most
	}
	start := pages(projector.Start)
	end := pages(near)
	t.Logf("pages touched by a 100-event batch: %v at the start of the log, %v 500 events before its end", start, end)
	if end > 2*start+10 {
		t.Fatalf("a batch near the end of a %d-event log touched %v pages, at the start %v: the read walks the log before the cursor", events, end, start)
	}
}

// waitHorizonPast waits until no transaction of the cluster older than the
// store's last event still runs: a log read is gap-safe (promise 3) and
// stops below such a transaction, which another test's may be, so a test
// that counts what a read returns waits for it to see every event.
func waitHorizonPast(t *testing.T, store *postgres.Store) {
	t.Helper()
	pgtest.Eventually(t, time.Minute, "the horizon to pass the inserted events", func() bool {
		var below bool
		err := store.Pool().QueryRow(context.Background(), `SELECT max(tx_id) < pg_snapshot_xmin(pg_current_snapshot()) FROM `+
			store.Table("projector_events")).Scan(&below)
		return err == nil && below
	})
}
