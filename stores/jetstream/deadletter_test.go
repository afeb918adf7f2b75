package jetstream_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/migrations"
	"github.com/projectorhq/projector/projection"
	pjs "github.com/projectorhq/projector/stores/jetstream"
	"github.com/projectorhq/projector/stores/postgres"
)

// deadLetter writes a dead letter of subscription for a new event of the
// store's log, as the claims consumer writes one, and returns its id and
// the event.
func (s *sink) deadLetter(t testing.TB, subscription, streamID string) (int64, projector.Event) {
	t.Helper()
	ctx := context.Background()
	var ev projector.Event
	err := pgx.BeginFunc(ctx, s.store.Pool(), func(tx pgx.Tx) error {
		res, err := s.store.Append(ctx, tx, projector.TenantStream("acme", "ticket", streamID), projector.AnyVersion, testevents.TicketCommented{Body: "dl", N: 1})
		if err == nil {
			ev = res.Events[0]
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	msg, err := pjs.NewMsg("projector", ev)
	if err != nil {
		t.Fatal(err)
	}
	headers, err := json.Marshal(msg.Header)
	if err != nil {
		t.Fatal(err)
	}
	var id int64
	if err := s.store.Pool().QueryRow(ctx, `INSERT INTO `+s.store.Table("projector_jetstream_dead_letters")+
		` (subscription, event_id, subject, headers, data, error, deliveries) VALUES ($1, $2, $3, $4, $5, 'boom', 5) RETURNING id`,
		subscription, ev.ID, msg.Subject, headers, msg.Data).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id, ev
}

func (s *sink) effectsOf(t testing.TB, ev projector.Event) int {
	t.Helper()
	var n int
	if err := s.store.Pool().QueryRow(context.Background(), `SELECT count(*) FROM `+s.effects+` WHERE event_id = $1`, ev.ID).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func (s *sink) status(t testing.TB, subscription string, id int64) pjs.DeadLetter {
	t.Helper()
	d, err := pjs.GetDeadLetter(context.Background(), s.store, subscription, id)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func ids(dls []pjs.DeadLetter) []int64 {
	out := make([]int64, len(dls))
	for i, d := range dls {
		out[i] = d.ID
	}
	return out
}

// A retried dead letter stays as resolved and a discarded one as
// discarded: neither is listed by default, both are by status or with all
// of them. Neither can be retried or discarded again, and a discarded one
// is never applied.
func TestDeadLettersKeepTheirRecord(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	types := testevents.New()
	snk := newSink(t, types.Registry)
	c, err := pjs.NewConsumer(pjs.ConsumerConfig{Store: snk.store, Subscription: "feed", Handler: snk.record})
	if err != nil {
		t.Fatal(err)
	}
	retried, evRetried := snk.deadLetter(t, "feed", "t1")
	discarded, evDiscarded := snk.deadLetter(t, "feed", "t2")
	open, _ := snk.deadLetter(t, "feed", "t3")
	other, _ := snk.deadLetter(t, "other", "t4")

	if err := c.RetryDeadLetter(ctx, retried); err != nil {
		t.Fatal(err)
	}
	if err := pjs.DiscardDeadLetter(ctx, snk.store, "feed", discarded); err != nil {
		t.Fatal(err)
	}
	if d := snk.status(t, "feed", retried); d.Status != projection.DeadLetterResolved || d.ResolvedAt == nil || d.LastRetriedAt == nil || d.Error != "boom" {
		t.Fatalf("retried dead letter: %+v, want it resolved with its times and original error", d)
	}
	if d := snk.status(t, "feed", discarded); d.Status != projection.DeadLetterDiscarded || d.ResolvedAt == nil || d.LastRetriedAt != nil {
		t.Fatalf("discarded dead letter: %+v, want it discarded, never retried", d)
	}
	if d := snk.status(t, "feed", open); d.Status != projection.DeadLetterOpen || d.ResolvedAt != nil {
		t.Fatalf("untouched dead letter: %+v, want it open", d)
	}

	for _, tc := range []struct {
		status string
		want   []int64
	}{
		{projection.DeadLetterOpen, []int64{open}},
		{projection.DeadLetterResolved, []int64{retried}},
		{projection.DeadLetterDiscarded, []int64{discarded}},
		{"", []int64{retried, discarded, open}},
	} {
		dls, err := pjs.ListDeadLettersMatching(ctx, snk.store, pjs.DeadLetterFilter{Subscription: "feed", Status: tc.status, Limit: 100})
		if err != nil || fmt.Sprint(ids(dls)) != fmt.Sprint(tc.want) {
			t.Fatalf("status %q: %v, %v; want %v", tc.status, ids(dls), err, tc.want)
		}
	}
	if dls, err := pjs.ListDeadLetters(ctx, snk.store, "feed", 100); err != nil || fmt.Sprint(ids(dls)) != fmt.Sprint([]int64{open}) {
		t.Fatalf("default listing: %v, %v; want the open one only", ids(dls), err)
	}
	if dls, err := pjs.ListDeadLettersMatching(ctx, snk.store, pjs.DeadLetterFilter{Subscription: "feed", Limit: 2}); err != nil || len(dls) != 2 {
		t.Fatalf("limit 2: %v, %v", ids(dls), err)
	}

	// No second outcome for a dead letter that has one.
	for name, try := range map[string]func() error{
		"retry of the resolved one":    func() error { return c.RetryDeadLetter(ctx, retried) },
		"discard of the resolved one":  func() error { return pjs.DiscardDeadLetter(ctx, snk.store, "feed", retried) },
		"retry of the discarded one":   func() error { return c.RetryDeadLetter(ctx, discarded) },
		"discard of the discarded one": func() error { return pjs.DiscardDeadLetter(ctx, snk.store, "feed", discarded) },
	} {
		err := try()
		if !errors.Is(err, pjs.ErrDeadLetterNotOpen) || !errors.Is(err, projector.ErrInvalidTransition) {
			t.Fatalf("%s: %v, want ErrDeadLetterNotOpen (an ErrInvalidTransition)", name, err)
		}
		if !strings.Contains(err.Error(), "already") {
			t.Fatalf("%s: %q does not say what the dead letter is", name, err)
		}
	}
	if n, m := snk.effectsOf(t, evRetried), snk.effectsOf(t, evDiscarded); n != 1 || m != 0 {
		t.Fatalf("effects: retried %d, discarded %d; want 1 and 0", n, m)
	}
	if d := snk.status(t, "feed", discarded); d.Status != projection.DeadLetterDiscarded {
		t.Fatalf("after the refusals: %+v", d)
	}

	// Unknown ids and another subscription's are not found, not refused.
	for name, try := range map[string]func() error{
		"retry of an unknown id":       func() error { return c.RetryDeadLetter(ctx, other+1000) },
		"discard of an unknown id":     func() error { return pjs.DiscardDeadLetter(ctx, snk.store, "feed", other+1000) },
		"retry of other's":             func() error { return c.RetryDeadLetter(ctx, other) },
		"discard of other's by feed":   func() error { return pjs.DiscardDeadLetter(ctx, snk.store, "feed", other) },
		"discard of feed's by other's": func() error { return pjs.DiscardDeadLetter(ctx, snk.store, "other", open) },
	} {
		if err := try(); !errors.Is(err, projector.ErrNotFound) {
			t.Fatalf("%s: %v, want ErrNotFound", name, err)
		}
	}
	if d := snk.status(t, "other", other); d.Status != projection.DeadLetterOpen {
		t.Fatalf("the other subscription's dead letter: %+v, want it untouched", d)
	}

	for _, bad := range []struct {
		status string
		limit  int
	}{{"all", 10}, {"gone", 10}, {"Open", 10}, {"open", 0}, {"open", 10_001}} {
		_, err := pjs.ListDeadLettersMatching(ctx, snk.store, pjs.DeadLetterFilter{Subscription: "feed", Status: bad.status, Limit: bad.limit})
		if bad.limit == 0 { // the filter's 0 is its default: ListDeadLetters wants 1..10000
			_, err = pjs.ListDeadLetters(ctx, snk.store, "feed", bad.limit)
		}
		if !errors.Is(err, pjs.ErrInvalidConfig) {
			t.Fatalf("status %q, limit %d: %v, want ErrInvalidConfig", bad.status, bad.limit, err)
		}
		if bad.limit == 10 && !errors.Is(err, projection.ErrInvalidFilter) {
			t.Fatalf("status %q: %v, want projection.ErrInvalidFilter too", bad.status, err)
		}
	}
}

// A failed retry rolls back the handler's writes, even when the handler's
// SQL error aborted the transaction, and records the failure (the new
// error, the retry's time) on the still-open dead letter as the consumer's
// own role: a tenant role, which tenant-scoped handlers run as, has no
// grant on the dead-letter table. The retry that then succeeds runs scoped
// to the event's tenant.
func TestDeadLetterFailedRetryIsRecorded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	types := testevents.New()
	schema := pgtest.Schema(t)
	role, notes := pgtest.TenantRole(t, schema)
	store, err := postgres.New(ctx, pgtest.Pool(t), postgres.Config{Schema: schema, Registry: types.Registry, TenantRole: role})
	if err != nil {
		t.Fatal(err)
	}
	snk := &sink{store: store, effects: store.Table("effects")}
	var mu sync.Mutex
	fail := true
	c, err := pjs.NewConsumer(pjs.ConsumerConfig{Store: store, Subscription: "feed", Handler: func(ctx context.Context, tx pgx.Tx, ev projector.Event) error {
		if _, err := tx.Exec(ctx, `INSERT INTO `+notes+` (tenant_id, body) VALUES ($1, $2)`, ev.Stream.Tenant, ev.ID.String()); err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		if fail {
			// An SQL error: it aborts the transaction.
			_, err := tx.Exec(ctx, `SELECT 1/0`)
			return err
		}
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	id, ev := snk.deadLetter(t, "feed", "t1")
	notesOf := func() int {
		var n int
		if err := store.Pool().QueryRow(ctx, `SELECT count(*) FROM `+notes+` WHERE body = $1`, ev.ID.String()).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	err = c.RetryDeadLetter(ctx, id)
	if err == nil || !strings.Contains(err.Error(), "division by zero") || !strings.Contains(err.Error(), ev.ID.String()) {
		t.Fatalf("failing retry: %v, want the handler's error naming the event", err)
	}
	if errors.Is(err, projector.ErrInvalidTransition) {
		t.Fatalf("failing retry reported as a refusal: %v", err)
	}
	d := snk.status(t, "feed", id)
	if d.Status != projection.DeadLetterOpen || d.ResolvedAt != nil || d.LastRetriedAt == nil || !strings.HasPrefix(d.Error, "retry: ") ||
		!strings.Contains(d.Error, "division by zero") {
		t.Fatalf("after a failed retry: %+v; want it open, with the retry's error and time", d)
	}
	if n := notesOf(); n != 0 {
		t.Fatalf("%d handler writes after a failed retry, want none", n)
	}

	mu.Lock()
	fail = false
	mu.Unlock()
	if err := c.RetryDeadLetter(ctx, id); err != nil {
		t.Fatal(err)
	}
	if d := snk.status(t, "feed", id); d.Status != projection.DeadLetterResolved || d.ResolvedAt == nil {
		t.Fatalf("after the retry: %+v, want it resolved", d)
	}
	if n := notesOf(); n != 1 {
		t.Fatalf("%d handler writes after the retry, want 1 (the tenant policy let it through)", n)
	}
}

// A retry and a discard of the same dead letter at once, in real
// concurrent transactions: exactly one of them wins, and the loser is
// refused with ErrDeadLetterNotOpen. The discard waits for the retry's row
// lock; when the retry commits the dead letter resolved, the discard finds
// it no longer open; when the retry fails, the discard goes through and the
// event is never applied. A second retry behind the first is refused the
// same way.
func TestDeadLetterRetryAndDiscardAtOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	types := testevents.New()
	snk := newSink(t, types.Registry)
	entered := make(chan struct{}, 1)
	release := make(chan error)
	blocking := func(ctx context.Context, tx pgx.Tx, ev projector.Event) error {
		entered <- struct{}{}
		if err := <-release; err != nil {
			return err
		}
		return snk.record(ctx, tx, ev)
	}
	c, err := pjs.NewConsumer(pjs.ConsumerConfig{Store: snk.store, Subscription: "feed", Handler: blocking, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	// The second party works through a pool of one connection, so the test
	// knows its backend and can see it queue behind the retry's row lock.
	pool := pgtest.NewPool(t, 1)
	second, err := postgres.New(ctx, pool, postgres.Config{Schema: snk.store.Schema(), Registry: types.Registry})
	if err != nil {
		t.Fatal(err)
	}
	var pid uint32
	if err := pool.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	c2, err := pjs.NewConsumer(pjs.ConsumerConfig{Store: second, Subscription: "feed", Handler: snk.record})
	if err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name        string
		handlerErr  error
		other       func(id int64) error
		wantStatus  string
		wantEffects int
	}{
		{"retry commits first", nil, func(id int64) error { return pjs.DiscardDeadLetter(ctx, second, "feed", id) }, projection.DeadLetterResolved, 1},
		{"retry fails first", errors.New("still broken"), func(id int64) error { return pjs.DiscardDeadLetter(ctx, second, "feed", id) }, projection.DeadLetterDiscarded, 0},
		{"a second retry behind the first", nil, func(id int64) error { return c2.RetryDeadLetter(ctx, id) }, projection.DeadLetterResolved, 1},
	} {
		id, ev := snk.deadLetter(t, "feed", "race-"+strings.ReplaceAll(tc.name, " ", "-"))
		var wg sync.WaitGroup
		var retryErr, otherErr error
		wg.Go(func() { retryErr = c.RetryDeadLetter(ctx, id) })
		<-entered // the retry holds the row now
		wg.Go(func() { otherErr = tc.other(id) })
		pgtest.WaitUntilBlocked(t, pgtest.Pool(t), pid) // not pool: its one connection is the one waiting
		release <- tc.handlerErr
		wg.Wait()
		switch {
		case tc.handlerErr == nil && retryErr == nil && errors.Is(otherErr, pjs.ErrDeadLetterNotOpen):
		case tc.handlerErr != nil && errors.Is(retryErr, tc.handlerErr) && otherErr == nil:
		default:
			t.Fatalf("%s: retry %v, other %v", tc.name, retryErr, otherErr)
		}
		if d := snk.status(t, "feed", id); d.Status != tc.wantStatus || d.ResolvedAt == nil {
			t.Fatalf("%s: %+v, want %s", tc.name, d, tc.wantStatus)
		}
		if n := snk.effectsOf(t, ev); n != tc.wantEffects {
			t.Fatalf("%s: applied %d times, want %d", tc.name, n, tc.wantEffects)
		}
	}

	// And unordered: each round, exactly one of a retry and a discard
	// succeeds, and the event is applied exactly when the retry won.
	free, err := pjs.NewConsumer(pjs.ConsumerConfig{Store: snk.store, Subscription: "feed", Handler: snk.record})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		id, ev := snk.deadLetter(t, "feed", fmt.Sprintf("free-%d", i))
		var wg sync.WaitGroup
		var retryErr, discardErr error
		wg.Go(func() { retryErr = free.RetryDeadLetter(ctx, id) })
		wg.Go(func() { discardErr = pjs.DiscardDeadLetter(ctx, second, "feed", id) })
		wg.Wait()
		applied := snk.effectsOf(t, ev)
		status := snk.status(t, "feed", id).Status
		switch {
		case retryErr == nil && errors.Is(discardErr, pjs.ErrDeadLetterNotOpen) && applied == 1 && status == projection.DeadLetterResolved:
		case discardErr == nil && errors.Is(retryErr, pjs.ErrDeadLetterNotOpen) && applied == 0 && status == projection.DeadLetterDiscarded:
		default:
			t.Fatalf("round %d: retry %v, discard %v, applied %d times, %s", i, retryErr, discardErr, applied, status)
		}
	}
}

// Migration 0013 on a schema that already has dead letters (written before
// it, when retry and discard deleted them): every one becomes open, keeps
// what it had, and is listed by default.
func TestMigration0013KeepsExistingDeadLettersOpen(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	schema := pgtest.SchemaName(t, "jsdl")
	q := pgx.Identifier{schema}.Sanitize()
	all, err := migrations.All()
	if err != nil {
		t.Fatal(err)
	}
	// The schema as the release before 0013 left it, applied the way the
	// migrator does, so Migrate then applies 0013 alone.
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `CREATE SCHEMA `+q+`; CREATE TABLE `+q+`.projector_migrations (
			version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
			return err
		}
		for _, m := range all {
			if m.Version >= 13 {
				break
			}
			if _, err := tx.Exec(ctx, strings.ReplaceAll(m.SQL, migrations.SchemaPlaceholder, q)); err != nil {
				return fmt.Errorf("migration %d: %w", m.Version, err)
			}
			if _, err := tx.Exec(ctx, `INSERT INTO `+q+`.projector_migrations (version, name) VALUES ($1, $2)`, m.Version, m.Name); err != nil {
				return err
			}
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+q+`.projector_jetstream_dead_letters (subscription, event_id, subject, headers, data, error, deliveries)
			VALUES ('feed', gen_random_uuid(), 'p.a', '{}', 'x', 'boom', 5), ('feed', NULL, 'p.b', '{}', 'y', 'undecodable', 1)`)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	applied, err := postgres.Migrate(ctx, pool, schema)
	if err != nil {
		t.Fatal(err)
	}
	if len(applied) == 0 || applied[0] != 13 {
		t.Fatalf("applied %v, want 13 first", applied)
	}
	store, err := postgres.New(ctx, pool, postgres.Config{Schema: schema, Registry: testevents.New().Registry})
	if err != nil {
		t.Fatal(err)
	}
	dls, err := pjs.ListDeadLetters(ctx, store, "feed", 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(dls) != 2 {
		t.Fatalf("%d open dead letters after the migration, want the 2 written before it", len(dls))
	}
	for _, d := range dls {
		if d.Status != projection.DeadLetterOpen || d.ResolvedAt != nil || d.LastRetriedAt != nil || d.Deliveries == 0 || d.Error == "" {
			t.Fatalf("after the migration: %+v", d)
		}
	}
	if err := pjs.DiscardDeadLetter(ctx, store, "feed", dls[0].ID); err != nil {
		t.Fatalf("discard after the migration: %v", err)
	}
	if _, err := pool.Exec(ctx, `UPDATE `+store.Table("projector_jetstream_dead_letters")+` SET status = 'gone' WHERE id = $1`, dls[1].ID); err == nil {
		t.Fatal("the status check let 'gone' in")
	}
}

// relay status counts open dead letters in every schema of the database;
// schemas created and dropped meanwhile by other sessions (another
// application's migrations, a test suite) are passed over, never an error.
func TestCountOpenDeadLettersInDatabaseWhileSchemasChurn(t *testing.T) {
	t.Parallel()
	store := pgtest.Store(t, testevents.New().Registry)
	ctx := context.Background()
	churn := pgx.Identifier{store.Schema() + "_churn"}.Sanitize()
	t.Cleanup(func() { _, _ = store.Pool().Exec(context.Background(), `DROP SCHEMA IF EXISTS `+churn+` CASCADE`) })
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			_, _ = store.Pool().Exec(ctx, `CREATE SCHEMA `+churn+`; CREATE TABLE `+churn+`.projector_jetstream_dead_letters (subscription text, status text)`)
			_, _ = store.Pool().Exec(ctx, `DROP SCHEMA IF EXISTS `+churn+` CASCADE`)
		}
	})
	defer wg.Wait()
	defer close(stop)
	for i := range 300 {
		if _, err := pjs.CountOpenDeadLettersInDatabase(ctx, store); err != nil {
			t.Fatalf("count %d while a schema is created and dropped: %v", i, err)
		}
	}
}
