package rebuild_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/rebuild"
)

// A log smaller than the shadow batch is still replayed in several
// batches, so a rebuild's progress moves before it reaches 100%: the
// shadow's first batch is small and grows pass by pass.
func TestShadowProgressMovesOnASmallLog(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	d1 := e.dispatcher(e.counter(1, projection.AsyncConfig{}))
	const events = 600
	for i := range events / 100 {
		e.appendBatch(t, i, 100)
	}
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	if err := d1.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var batches []int
	v2 := e.counter(2, projection.AsyncConfig{AfterCommit: func(evs []projector.Event) {
		mu.Lock()
		defer mu.Unlock()
		batches = append(batches, len(evs))
	}})
	e.dispatcher(v2)
	if _, err := rebuild.Request(e.ctx, e.store, "counter", rebuild.Options{Hold: true, Version: 2}); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "the held rebuild to be ready", func() bool {
		r, err := rebuild.Current(e.ctx, e.store, "counter")
		return err == nil && r.Status == rebuild.Ready
	})
	mu.Lock()
	defer mu.Unlock()
	if len(batches) < 2 || batches[0] >= events {
		t.Fatalf("the shadow replayed %d events in batches %v: progress jumps from 0%% to 100%%", events, batches)
	}
}

// A shadow pass names itself in pg_stat_activity, whatever the pool's
// application_name: a long shadow batch holds the horizon, and the horizon
// line must tell Projector's own work from a forgotten session.
func TestShadowPassNamesItself(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	d1 := e.dispatcher(e.counter(1, projection.AsyncConfig{}))
	e.appendBatch(t, 0, 3)
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	if err := d1.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	names := pgx.Identifier{e.schema, "app_names"}.Sanitize()
	e.exec(`CREATE TABLE ` + names + ` (name text NOT NULL)`)
	v2 := e.counter(2, projection.AsyncConfig{})
	must(projection.OnEvent(v2, e.types.Closed, func(ctx context.Context, tx pgx.Tx, ev projector.Event) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+names+` VALUES (current_setting('application_name'))`)
		return err
	}))
	if err := pgx.BeginFunc(e.ctx, e.store.Pool(), func(tx pgx.Tx) error {
		_, err := e.store.Append(e.ctx, tx, projector.Stream("ticket", "closed"), projector.NoStream, testevents.TicketClosed{})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	e.dispatcher(v2)
	if _, err := rebuild.Request(e.ctx, e.store, "counter", rebuild.Options{Hold: true, Version: 2}); err != nil {
		t.Fatal(err)
	}
	// Wait for the shadow to apply the event, not for the rebuild to be
	// ready: a transaction of another test holding the horizon lets a
	// shadow report ready before it could read the event (the live
	// consumer takes over from its cursor at the switch).
	var got []string
	var err error
	eventually(t, time.Minute, "the shadow pass to apply the closed event", func() bool {
		var rows pgx.Rows
		if rows, err = e.store.Pool().Query(e.ctx, `SELECT name FROM `+names); err == nil {
			got, err = pgx.CollectRows(rows, pgx.RowTo[string])
		}
		return err != nil || len(got) > 0
	})
	if err != nil || len(got) != 1 || got[0] != "projector rebuild counter" {
		t.Fatalf("application_name during the shadow pass: %q, %v; want \"projector rebuild counter\"", got, err)
	}
}
