package projection_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

// Promise 10: every transition from a state that does not allow it is a
// typed error and leaves the shard's row exactly as it was.
func TestPromise10_GuardedTransitions(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	admin := projection.NewAdmin(e.store)
	ev := e.appendOne("x", projector.NoStream, testevents.TicketOpened{Title: "x"})[0]
	consumers := e.store.Table("projector_consumers")
	e.exec(`INSERT INTO ` + consumers + ` (name, instance_id) VALUES ('ops', '__shared__')`)
	id := projection.ShardID{Consumer: "ops"}

	type op struct {
		name    string
		run     func(context.Context, projection.ShardID) error
		allowed []projection.Status
	}
	ops := []op{
		{"restart", admin.Restart, []projection.Status{projection.StatusDead}},
		{"skip", admin.Skip, []projection.Status{projection.StatusDead}}, // processing only while failing
		{"disable", admin.Disable, []projection.Status{projection.StatusIdle, projection.StatusProcessing, projection.StatusDead}},
		{"enable", admin.Enable, []projection.Status{projection.StatusDisabled}},
	}
	rowOf := func() string {
		var s string
		if err := e.store.Pool().QueryRow(e.ctx, `SELECT row_to_json(c)::text FROM `+consumers+` c WHERE name = 'ops'`).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	setState := func(status projection.Status, failing bool) {
		if failing {
			e.exec(`UPDATE `+consumers+` SET status = $1, attempts = 2, last_error = 'boom', last_error_at = now(),
				failed_tx_id = $2, failed_seq = $3, failed_event_id = $4 WHERE name = 'ops'`, status, ev.Position.TxID, ev.Position.Seq, ev.ID)
			return
		}
		e.exec(`UPDATE `+consumers+` SET status = $1, attempts = 0, last_error = NULL, failed_tx_id = NULL, failed_seq = NULL, failed_event_id = NULL WHERE name = 'ops'`, status)
	}
	for _, o := range ops {
		for _, from := range []projection.Status{projection.StatusIdle, projection.StatusProcessing, projection.StatusDead, projection.StatusDisabled} {
			allowed := false
			for _, a := range o.allowed {
				allowed = allowed || a == from
			}
			if allowed {
				continue
			}
			setState(from, false)
			before := rowOf()
			err := o.run(e.ctx, id)
			var te *projection.TransitionError
			if !errors.Is(err, projector.ErrInvalidTransition) || !errors.As(err, &te) || te.From != from {
				t.Errorf("%s from %s: %v, want a TransitionError", o.name, from, err)
			}
			if after := rowOf(); after != before {
				t.Errorf("%s from %s changed the row:\n before %s\n after  %s", o.name, from, before, after)
			}
		}
	}
	// Skip while processing but with nothing failing is refused too.
	setState(projection.StatusProcessing, false)
	before := rowOf()
	if err := admin.Skip(e.ctx, id); !errors.Is(err, projector.ErrInvalidTransition) {
		t.Errorf("skip with nothing failing: %v", err)
	}
	if rowOf() != before {
		t.Error("refused skip changed the row")
	}
	// And the allowed ones work: skip while failing, disable, enable.
	setState(projection.StatusProcessing, true)
	if err := admin.Skip(e.ctx, id); err != nil {
		t.Fatalf("skip while failing: %v", err)
	}
	if st := e.status(admin, "ops"); st.Cursor != ev.Position || st.Status != projection.StatusIdle || st.Attempts != 0 {
		t.Fatalf("after skip: %+v", st)
	}
	for _, step := range []func(context.Context, projection.ShardID) error{admin.Disable, admin.Enable} {
		if err := step(e.ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if err := admin.Restart(e.ctx, projection.ShardID{Consumer: "nobody"}); !errors.Is(err, projector.ErrNotFound) {
		t.Fatalf("restart of an unknown consumer: %v", err)
	}
}

// Promise 8: handlers run in a transaction scoped to their event's tenant,
// enforced by PostgreSQL: a tenant-a handler sees only a's rows and cannot
// write b's, although the test connects as a superuser. System events run
// unscoped.
func TestPromise8_HandlersAreTenantScoped(t *testing.T) {
	t.Parallel()
	types := testevents.New()
	schema := pgtest.Schema(t)
	ctx := context.Background()
	pool := pgtest.Pool(t)
	role, notes := pgtest.TenantRole(t, schema)
	if _, err := pool.Exec(ctx, `INSERT INTO `+notes+` VALUES ('a', 'a-note'), ('b', 'b-note')`); err != nil {
		t.Fatal(err)
	}
	store, err := postgres.New(ctx, pool, postgres.Config{Schema: schema, Registry: types.Registry, TenantRole: role})
	if err != nil {
		t.Fatal(err)
	}

	type seen struct {
		tenant   string
		visible  int
		forgeErr string
	}
	results := make(chan seen, 10)
	p := projection.NewAsync("tenancy", projection.AsyncConfig{})
	must(projection.On(p, types.Opened, func(ctx context.Context, tx pgx.Tx, ev projector.Event, _ testevents.TicketOpened) error {
		var s seen
		s.tenant = ev.Stream.Tenant
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM `+notes).Scan(&s.visible); err != nil {
			return err
		}
		// Try to write the other tenant's row, in a savepoint so the
		// expected refusal does not abort the batch.
		sp, err := tx.Begin(ctx)
		if err != nil {
			return err
		}
		_, err = sp.Exec(ctx, `INSERT INTO `+notes+` VALUES ('b', 'forged by '||$1::text)`, ev.Stream.Tenant)
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) {
			s.forgeErr = pgErr.Code
			_ = sp.Rollback(ctx)
		} else if err := sp.Commit(ctx); err != nil {
			return err
		}
		results <- s
		return nil
	}))
	env := &env{t: t, ctx: ctx, types: types, schema: schema, store: store}
	d := env.dispatcher(projection.Config{Projections: []*projection.Async{p}})
	for _, ref := range []projector.StreamRef{projector.TenantStream("a", "ticket", "1"), projector.Stream("ticket", "sys")} {
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := store.Append(ctx, tx, ref, projector.NoStream, testevents.TicketOpened{Title: "t"})
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := d.CatchUp(cctx); err != nil {
		t.Fatal(err)
	}
	close(results)
	got := map[string]seen{}
	for s := range results {
		got[s.tenant] = s
	}
	if a := got["a"]; a.visible != 1 || a.forgeErr != "42501" {
		t.Errorf("tenant a handler: saw %d rows (want 1), forging b's row gave %q (want 42501)", a.visible, a.forgeErr)
	}
	if sys := got[projector.SystemTenant]; sys.visible != 2 || sys.forgeErr != "" {
		t.Errorf("system handler: saw %d rows (want 2), write error %q (want none)", sys.visible, sys.forgeErr)
	}
}

func TestMetrics(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	versions := e.appendMany(2, 600, 20)
	reg := prometheus.NewRegistry()
	p := counting(e.schema, e.types, "metered", projection.AsyncConfig{BatchSize: 100})
	d := e.dispatcher(projection.Config{Projections: []*projection.Async{p}, Registerer: reg, MetricsEvery: 20 * time.Millisecond})
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	if err := d.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	value := func(name string, labels map[string]string) (float64, bool) {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() != name {
				continue
			}
		next:
			for _, m := range mf.GetMetric() {
				for k, v := range labels {
					if !hasLabel(m, k, v) {
						continue next
					}
				}
				switch {
				case m.Counter != nil:
					return m.Counter.GetValue(), true
				case m.Gauge != nil:
					return m.Gauge.GetValue(), true
				case m.Histogram != nil:
					return float64(m.Histogram.GetSampleCount()), true
				}
			}
		}
		return 0, false
	}
	shard := map[string]string{"consumer": "metered", "instance_id": projection.SharedInstance}
	// The counter moves just after the commit CatchUp sees.
	eventually(t, time.Minute, "the processed counter to count every event", func() bool {
		v, _ := value("projector_events_processed_total", shard)
		return v == float64(total(versions))
	})
	if v, ok := value("projector_batch_apply_duration_seconds", shard); !ok || v < 6 {
		t.Errorf("batch histogram count %v, want at least 6 batches", v)
	}
	eventually(t, time.Minute, "gauges refreshed to caught up", func() bool {
		idle, _ := value("projector_consumer_status", map[string]string{"consumer": "metered", "status": "idle"})
		lag, ok := value("projector_consumer_lag_events", shard)
		return idle == 1 && ok && lag == 0
	})
	if _, ok := value("projector_horizon_age_seconds", nil); !ok {
		t.Error("no horizon age gauge")
	}
	// A second dispatcher on the same registerer is refused with advice.
	if _, err := projection.New(projection.Config{Store: e.store, Projections: []*projection.Async{p}, Registerer: reg}); err == nil {
		t.Error("a second dispatcher registered the same metrics")
	}
}

func hasLabel(m *dto.Metric, k, v string) bool {
	for _, l := range m.GetLabel() {
		if l.GetName() == k && l.GetValue() == v {
			return true
		}
	}
	return false
}
