package rebuild_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/rebuild"
)

// A dispatcher shares a full batch read among its shards at the same
// position (projection.Config.SeparateReads off, the default). With shards
// at different positions — two from the start, one caught up halfway, one
// that goes dead on a poison event, one disabled, one being rebuilt blue/green
// from the start — and writers committing out of order while they run,
// every shard applies exactly what it would have read itself: each live
// model every event once, in stream order; the dead shard exactly the
// events before the poison one; the disabled shard nothing more; the
// rebuilt model every event once. And the reads were shared: the test
// would pass vacuously otherwise.
func TestSharedReadsAcrossShardsInEveryState(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	applied := pgx.Identifier{e.schema, "applied"}.Sanitize()
	e.exec(`CREATE TABLE ` + applied + ` (consumer text NOT NULL, event_id uuid NOT NULL, stream_id text NOT NULL,
		version bigint NOT NULL, n int NOT NULL, ord bigint GENERATED ALWAYS AS IDENTITY, PRIMARY KEY (consumer, event_id))`)
	rebuilt := e.schema + ".rebuilt"
	e.exec(`CREATE TABLE ` + pgx.Identifier{e.schema, "rebuilt"}.Sanitize() + ` (event_id uuid PRIMARY KEY, n int NOT NULL)`)

	const size = 20 // every shard's batch, the shadow's too: the same reads
	recorder := func(name string, poison bool) *projection.Async {
		p := projection.NewAsync(name, projection.AsyncConfig{BatchSize: size, RebuildBatchSize: size, MaxAttempts: 1})
		h := func(ctx context.Context, tx pgx.Tx, ev projector.Event) error {
			if poison && ev.Stream.ID == "poison" {
				return fmt.Errorf("poison event %s", ev.ID)
			}
			_, err := tx.Exec(ctx, `INSERT INTO `+applied+` AS a (consumer, event_id, stream_id, version, n) VALUES ($1, $2, $3, $4, 1)
				ON CONFLICT (consumer, event_id) DO UPDATE SET n = a.n + 1`, name, ev.ID, ev.Stream.ID, ev.Version)
			return err
		}
		must(projection.OnEvent(p, e.types.Opened, h))
		must(projection.OnEvent(p, e.types.Commented, h))
		return p
	}
	rebuiltProjection := func() *projection.Async {
		p := projection.NewAsync("rebuilt", projection.AsyncConfig{BatchSize: size, RebuildBatchSize: size, Tables: []string{rebuilt}})
		h := func(ctx context.Context, tx pgx.Tx, ev projector.Event) error {
			_, err := tx.Exec(ctx, `INSERT INTO `+projection.Table(ctx, rebuilt)+` AS r (event_id, n) VALUES ($1, 1)
				ON CONFLICT (event_id) DO UPDATE SET n = r.n + 1`, ev.ID)
			return err
		}
		must(projection.OnEvent(p, e.types.Opened, h))
		must(projection.OnEvent(p, e.types.Commented, h))
		return p
	}
	backlog := func(prefix string, n int) {
		err := pgx.BeginFunc(e.ctx, e.store.Pool(), func(tx pgx.Tx) error {
			for i := range n {
				if _, err := e.store.Append(e.ctx, tx, projector.Stream("ticket", fmt.Sprintf("%s-%d", prefix, i)), projector.NoStream,
					testevents.TicketOpened{Title: "t"}, testevents.TicketCommented{Body: "c"}); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(e.ctx, 3*time.Minute)
	defer cancel()

	// Before: "ahead" and "disabled" apply the first part of the log, the
	// live "rebuilt" all of it up to the poison event.
	backlog("first", 150)
	before := startDispatcher(t, e.store, projection.Config{SeparateReads: true},
		recorder("ahead", false), recorder("disabled", false), rebuiltProjection())
	if err := before.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	stopCtx, stopCancel := context.WithTimeout(e.ctx, 30*time.Second)
	defer stopCancel()
	if err := before.Stop(stopCtx); err != nil {
		t.Fatal(err)
	}
	admin := projection.NewAdmin(e.store)
	disabled := projection.ShardID{Consumer: "disabled", Instance: projection.SharedInstance}
	if err := admin.Disable(e.ctx, disabled); err != nil {
		t.Fatal(err)
	}
	disabledBefore := e.appliedBy(applied, "disabled")
	backlog("second", 100)
	err := pgx.BeginFunc(e.ctx, e.store.Pool(), func(tx pgx.Tx) error {
		_, err := e.store.Append(e.ctx, tx, projector.Stream("ticket", "poison"), projector.NoStream, testevents.TicketOpened{Title: "poison"})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	backlog("third", 100)

	// During: writers commit out of order (one holds its transaction open
	// while younger ones commit) while every shard runs and "rebuilt" is
	// rebuilt from the start.
	reg := prometheus.NewRegistry()
	startDispatcher(t, e.store, projection.Config{Registerer: reg},
		recorder("fresh-a", false), recorder("fresh-b", false), recorder("ahead", false),
		recorder("dead", true), recorder("disabled", false), rebuiltProjection())
	if _, err := rebuild.Request(e.ctx, e.store, "rebuilt", rebuild.Options{}); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	writers, slow := e.write(2, stop), e.slowWriter(stop)
	time.AfterFunc(time.Second, func() { close(stop) })
	writers.Wait()
	slow.Wait()
	final, err := rebuild.Wait(ctx, e.store, "rebuilt", 10*time.Millisecond, nil)
	if err != nil || final.Status != rebuild.Switched {
		t.Fatalf("rebuild ended %+v, %v", final, err)
	}
	// CatchUp reports the dead shard as an error rather than waiting: wait
	// for the live ones by their models.
	var all int
	if err := e.store.Pool().QueryRow(e.ctx, `SELECT count(*) FROM `+e.store.Table("projector_events")).Scan(&all); err != nil {
		t.Fatal(err)
	}
	eventually(t, 2*time.Minute, "the live shards caught up", func() bool {
		return e.appliedBy(applied, "fresh-a") >= all && e.appliedBy(applied, "fresh-b") >= all && e.appliedBy(applied, "ahead") >= all
	})

	// After: compare each model with the log.
	for _, name := range []string{"fresh-a", "fresh-b", "ahead"} {
		e.checkApplied(applied, name, `true`, all)
	}
	st, err := admin.Status(e.ctx, projection.ShardID{Consumer: "dead", Instance: projection.SharedInstance})
	if err != nil {
		t.Fatal(err)
	}
	if st.Status != projection.StatusDead {
		t.Errorf("dead: status %s, want dead", st.Status)
	}
	var beforePoison int
	if err := e.store.Pool().QueryRow(e.ctx, `SELECT count(*) FROM `+e.store.Table("projector_events")+` ev
		WHERE (ev.tx_id, ev.seq) < (SELECT tx_id, seq FROM `+e.store.Table("projector_events")+` WHERE stream_id = 'poison')`).Scan(&beforePoison); err != nil {
		t.Fatal(err)
	}
	e.checkApplied(applied, "dead", `(ev.tx_id, ev.seq) < (SELECT tx_id, seq FROM `+e.store.Table("projector_events")+` WHERE stream_id = 'poison')`, beforePoison)
	if got := e.appliedBy(applied, "disabled"); got != disabledBefore || got == 0 {
		t.Errorf("disabled: applied %d events, %d before it was disabled", got, disabledBefore)
	}
	var rebuiltOnce, rebuiltTwice int
	if err := e.store.Pool().QueryRow(e.ctx, `SELECT count(*) FILTER (WHERE r.n = 1), count(*) FILTER (WHERE r.n <> 1)
		FROM `+e.store.Table("projector_events")+` ev JOIN `+pgx.Identifier{e.schema, "rebuilt"}.Sanitize()+` r ON r.event_id = ev.id`).
		Scan(&rebuiltOnce, &rebuiltTwice); err != nil {
		t.Fatal(err)
	}
	if rebuiltOnce != all || rebuiltTwice != 0 {
		t.Errorf("rebuilt model: %d events once and %d more than once, want all %d once", rebuiltOnce, rebuiltTwice, all)
	}

	shared := 0.0
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "projector_shared_reads_total" {
			for _, m := range mf.GetMetric() {
				shared += m.GetCounter().GetValue()
			}
		}
	}
	if shared == 0 {
		t.Error("no shard took a batch from another's read: the test proved nothing about sharing")
	}
	t.Logf("%d events; %.0f batches shared", all, shared)
}

// appliedBy counts the events consumer applied.
func (e *env) appliedBy(table, consumer string) int {
	e.t.Helper()
	var n int
	if err := e.store.Pool().QueryRow(e.ctx, `SELECT count(*) FROM `+table+` WHERE consumer = $1`, consumer).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

// checkApplied fails unless consumer applied exactly the events of the log
// matching where (want of them), each once, and each stream's in version
// order.
func (e *env) checkApplied(table, consumer, where string, want int) {
	e.t.Helper()
	var matched, once, extra, disorder int
	err := e.store.Pool().QueryRow(e.ctx, `SELECT
			(SELECT count(*) FROM `+e.store.Table("projector_events")+` ev WHERE `+where+`),
			(SELECT count(*) FROM `+e.store.Table("projector_events")+` ev JOIN `+table+` a ON a.event_id = ev.id AND a.consumer = $1
				WHERE a.n = 1 AND `+where+`),
			(SELECT count(*) FROM `+table+` a WHERE a.consumer = $1 AND (a.n <> 1 OR NOT EXISTS (
				SELECT 1 FROM `+e.store.Table("projector_events")+` ev WHERE ev.id = a.event_id AND `+where+`))),
			(SELECT count(*) FROM `+table+` a JOIN `+table+` b ON a.consumer = b.consumer AND a.stream_id = b.stream_id
				WHERE a.consumer = $1 AND a.version < b.version AND a.ord > b.ord)`, consumer).
		Scan(&matched, &once, &extra, &disorder)
	if err != nil {
		e.t.Fatal(err)
	}
	if matched != want || once != want || extra != 0 || disorder != 0 {
		e.t.Errorf("%s: applied %d of %d events once (want %d); %d applied twice or not due; %d out of stream order",
			consumer, once, matched, want, extra, disorder)
	}
}
