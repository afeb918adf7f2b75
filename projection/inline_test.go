package projection_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

// Inline projections commit with the append, or not at all: a failing
// handler rolls back the events and the caller's own writes; a succeeding
// one is visible together with the events.
func TestInlineProjectionAtomicity(t *testing.T) {
	t.Parallel()
	types := testevents.New()
	schema := pgtest.Schema(t)
	ctx := context.Background()
	pool := pgtest.Pool(t)
	summary := pgx.Identifier{schema, "summary"}.Sanitize()
	orders := pgx.Identifier{schema, "orders"}.Sanitize()
	for _, sql := range []string{
		`CREATE TABLE ` + summary + ` (id text PRIMARY KEY, title text NOT NULL, comments int NOT NULL DEFAULT 0, closed bool NOT NULL DEFAULT false)`,
		`CREATE TABLE ` + orders + ` (id text PRIMARY KEY)`,
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	p := projection.NewInline("ticket_summary")
	must(projection.On(p, types.Opened, func(ctx context.Context, tx pgx.Tx, ev projector.Event, e testevents.TicketOpened) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+summary+` (id, title) VALUES ($1, $2)`, ev.Stream.ID, e.Title)
		return err
	}))
	must(projection.On(p, types.Commented, func(ctx context.Context, tx pgx.Tx, ev projector.Event, e testevents.TicketCommented) error {
		if e.Body == "explode" {
			return errors.New("comment refused by the read model")
		}
		_, err := tx.Exec(ctx, `UPDATE `+summary+` SET comments = comments + 1 WHERE id = $1`, ev.Stream.ID)
		return err
	}))
	store, err := postgres.New(ctx, pool, postgres.Config{Schema: schema, Registry: types.Registry, Inline: []postgres.InlineProjection{p}})
	if err != nil {
		t.Fatal(err)
	}
	count := func(table string) (n int) {
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+table).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO `+orders+` VALUES ('o1')`); err != nil {
			return err
		}
		_, err := store.Append(ctx, tx, projector.Stream("ticket", "t1"), projector.NoStream,
			testevents.TicketOpened{Title: "hello"}, testevents.TicketCommented{Body: "first"})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	var comments int
	if err := pool.QueryRow(ctx, `SELECT comments FROM `+summary+` WHERE id = 't1'`).Scan(&comments); err != nil || comments != 1 {
		t.Fatalf("summary after a good append: %d comments, %v", comments, err)
	}

	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO `+orders+` VALUES ('o2')`); err != nil {
			return err
		}
		_, err := store.Append(ctx, tx, projector.Stream("ticket", "t2"), projector.NoStream,
			testevents.TicketOpened{Title: "doomed"}, testevents.TicketCommented{Body: "explode"})
		return err
	})
	if err == nil {
		t.Fatal("append with a failing inline handler succeeded")
	}
	if n := count(summary); n != 1 {
		t.Errorf("summary has %d rows; the failed append's row must be gone", n)
	}
	if n := count(orders); n != 1 {
		t.Errorf("orders has %d rows; the caller's write in the failed transaction must be gone", n)
	}
	if n := count(store.Table("projector_events")); n != 2 {
		t.Errorf("%d events; the failed append's must be gone", n)
	}
}

func TestInlineProjectionValidatedAtStoreStart(t *testing.T) {
	t.Parallel()
	types := testevents.New()
	p := projection.NewInline("bad")
	strangers := projector.NewRegistry()
	type stranger struct{}
	must(projection.OnEvent(p, projector.MustDefine[stranger](strangers, "stranger.arrived"),
		func(context.Context, pgx.Tx, projector.Event) error { return nil }))
	_, err := postgres.New(context.Background(), pgtest.Pool(t), postgres.Config{Schema: pgtest.Schema(t), Registry: types.Registry, Inline: []postgres.InlineProjection{p}})
	if !errors.Is(err, projection.ErrInvalidDefinition) {
		t.Fatalf("store with an inline projection of an undefined type: %v", err)
	}
}

// inlineFenceSetup is a schema with a summary table and a way to build the
// same inline projection at any version, as two deployments of one program
// would.
type inlineFenceSetup struct {
	ctx     context.Context
	pool    *pgxpool.Pool
	types   testevents.Types
	schema  string
	summary string
}

func newInlineFenceSetup(t *testing.T) *inlineFenceSetup {
	t.Helper()
	s := &inlineFenceSetup{ctx: context.Background(), pool: pgtest.Pool(t), types: testevents.New(), schema: pgtest.Schema(t)}
	s.summary = pgx.Identifier{s.schema, "summary"}.Sanitize()
	if _, err := s.pool.Exec(s.ctx, `CREATE TABLE `+s.summary+` (id text PRIMARY KEY, title text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return s
}

// projection returns "ticket_summary" at version, handling ticket.opened
// (and ticket.closed too when alsoClosed).
func (s *inlineFenceSetup) projection(t *testing.T, version int, alsoClosed bool) *projection.Inline {
	t.Helper()
	p := projection.NewInline("ticket_summary")
	if err := p.SetVersion(version); err != nil {
		t.Fatal(err)
	}
	must(projection.On(p, s.types.Opened, func(ctx context.Context, tx pgx.Tx, ev projector.Event, e testevents.TicketOpened) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+s.summary+` (id, title) VALUES ($1, $2)`, ev.Stream.ID, e.Title)
		return err
	}))
	if alsoClosed {
		must(projection.On(p, s.types.Closed, func(ctx context.Context, tx pgx.Tx, ev projector.Event, e testevents.TicketClosed) error {
			_, err := tx.Exec(ctx, `DELETE FROM `+s.summary+` WHERE id = $1`, ev.Stream.ID)
			return err
		}))
	}
	return p
}

func (s *inlineFenceSetup) store(t *testing.T, cfg postgres.Config) *postgres.Store {
	t.Helper()
	cfg.Schema, cfg.Registry = s.schema, s.types.Registry
	store, err := postgres.New(s.ctx, s.pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return store
}

// appendOne appends payload to a new stream id in its own transaction and
// commits when the append succeeds.
func (s *inlineFenceSetup) appendOne(store *postgres.Store, id string, payload any) error {
	return pgx.BeginFunc(s.ctx, s.pool, func(tx pgx.Tx) error {
		_, err := store.Append(s.ctx, tx, projector.Stream("ticket", id), projector.AnyVersion, payload)
		return err
	})
}

func (s *inlineFenceSetup) count(t *testing.T, sql string, args ...any) (n int) {
	t.Helper()
	if err := s.pool.QueryRow(s.ctx, sql, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func wantInlineRefusal(t *testing.T, err error, want postgres.InlineProjectionError) {
	t.Helper()
	if !errors.Is(err, postgres.ErrInlineProjectionRequired) {
		t.Fatalf("append: %v; want ErrInlineProjectionRequired", err)
	}
	var ie *postgres.InlineProjectionError
	if !errors.As(err, &ie) {
		t.Fatalf("append: %v; want an *InlineProjectionError", err)
	}
	if *ie != want {
		t.Errorf("refusal %+v; want %+v", *ie, want)
	}
	// The message names the projection and the type and says what to do.
	todo := "raise the version"
	switch {
	case want.Have == 0:
		todo = "postgres.Config.Inline"
	case want.Have < want.Recorded:
		todo = "finish deploying"
	}
	for _, s := range []string{want.Projection, want.EventType, todo} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("message %q does not mention %q", err, s)
		}
	}
}

// A second program appending to the schema without an inline projection the
// first one runs must not leave that read model silently wrong: its appends
// of the covered types are refused, with nothing written and the caller's
// transaction still usable; other types go through.
func TestInlineProjectionRecordedRefusesStoreWithout(t *testing.T) {
	t.Parallel()
	s := newInlineFenceSetup(t)
	withP := s.store(t, postgres.Config{Inline: []postgres.InlineProjection{s.projection(t, 1, false)}})
	without := s.store(t, postgres.Config{})

	var names []string
	var versions []int
	if err := pgx.BeginFunc(s.ctx, s.pool, func(tx pgx.Tx) error {
		_, err := without.Append(s.ctx, tx, projector.Stream("ticket", "t1"), projector.NoStream, testevents.TicketOpened{Title: "bypass"})
		wantInlineRefusal(t, err, postgres.InlineProjectionError{Projection: "ticket_summary", EventType: "ticket.opened", Recorded: 1, Have: 0})
		// The refusal wrote nothing (the stream still does not exist) and
		// left the transaction usable for a type no projection covers.
		_, err = without.Append(s.ctx, tx, projector.Stream("ticket", "t1"), projector.NoStream, testevents.TicketCommented{Body: "fine"})
		return err
	}); err != nil {
		t.Fatalf("append of an uncovered type after the refusal: %v", err)
	}
	if n := s.count(t, `SELECT count(*) FROM `+without.Table("projector_events")+` WHERE type = 'ticket.opened'`); n != 0 {
		t.Errorf("%d ticket.opened events written by the store without the projection", n)
	}
	if n := s.count(t, `SELECT count(*) FROM `+without.Table("projector_events")+` WHERE type = 'ticket.commented'`); n != 1 {
		t.Errorf("%d ticket.commented events; want 1", n)
	}

	// The store that runs the projection appends the covered type as before.
	if err := s.appendOne(withP, "t2", testevents.TicketOpened{Title: "applied"}); err != nil {
		t.Fatal(err)
	}
	if n := s.count(t, `SELECT count(*) FROM `+s.summary); n != 1 {
		t.Errorf("summary has %d rows; want the one the projection wrote", n)
	}

	// The record names the projection, its version and its types.
	rows, err := s.pool.Query(s.ctx, `SELECT name, version FROM `+withP.Table("projector_inline_projections")+` WHERE event_types = ARRAY['ticket.opened']`)
	if err != nil {
		t.Fatal(err)
	}
	var name string
	var version int
	if _, err := pgx.ForEachRow(rows, []any{&name, &version}, func() error {
		names, versions = append(names, name), append(versions, version)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(names) != 1 || names[0] != "ticket_summary" || versions[0] != 1 {
		t.Errorf("recorded %v at %v; want ticket_summary at 1", names, versions)
	}
}

// The fence a rolling deploy needs: once a store with a newer version of an
// inline projection has started, a store running the older version (already
// running, or starting later) is refused the covered types; the newest
// version stays recorded; retiring the projection lifts the fence.
func TestInlineProjectionVersionFence(t *testing.T) {
	t.Parallel()
	s := newInlineFenceSetup(t)
	// A short refresh so the running old store notices by itself.
	old := s.store(t, postgres.Config{Inline: []postgres.InlineProjection{s.projection(t, 1, false)}, InlineRefresh: 20 * time.Millisecond})
	if err := s.appendOne(old, "t1", testevents.TicketOpened{Title: "v1"}); err != nil {
		t.Fatal(err)
	}
	newer := s.store(t, postgres.Config{Inline: []postgres.InlineProjection{s.projection(t, 2, true)}})
	if err := s.appendOne(newer, "t2", testevents.TicketOpened{Title: "v2"}); err != nil {
		t.Fatal(err)
	}

	// The running v1 store re-reads the record in the background; until it
	// has, it may still append. Poll, rolling every attempt back.
	deadline := time.Now().Add(10 * time.Second)
	for {
		tx, err := s.pool.Begin(s.ctx)
		if err != nil {
			t.Fatal(err)
		}
		_, err = old.Append(s.ctx, tx, projector.Stream("ticket", "t3"), projector.AnyVersion, testevents.TicketOpened{Title: "stale"})
		_ = tx.Rollback(s.ctx)
		if err != nil {
			wantInlineRefusal(t, err, postgres.InlineProjectionError{Projection: "ticket_summary", EventType: "ticket.opened", Recorded: 2, Have: 1})
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the running v1 store was never refused after v2 was recorded")
		}
		time.Sleep(10 * time.Millisecond) // polling interval, not synchronisation
	}
	// The covered type v2 added is refused to the v1 store too, which has no
	// handler for it.
	err := s.appendOne(old, "t4", testevents.TicketClosed{})
	wantInlineRefusal(t, err, postgres.InlineProjectionError{Projection: "ticket_summary", EventType: "ticket.closed", Recorded: 2, Have: 1})

	// A v1 store starting now does not lower the record and is refused at once.
	late := s.store(t, postgres.Config{Inline: []postgres.InlineProjection{s.projection(t, 1, false)}})
	err = s.appendOne(late, "t5", testevents.TicketOpened{Title: "late"})
	wantInlineRefusal(t, err, postgres.InlineProjectionError{Projection: "ticket_summary", EventType: "ticket.opened", Recorded: 2, Have: 1})
	if v := s.count(t, `SELECT version FROM `+late.Table("projector_inline_projections")+` WHERE name = 'ticket_summary'`); v != 2 {
		t.Errorf("recorded version %d after a v1 store started; want 2", v)
	}
	if n := s.count(t, `SELECT count(*) FROM `+late.Table("projector_events")+` WHERE stream_id IN ('t3', 't4', 't5')`); n != 0 {
		t.Errorf("%d events written by refused appends", n)
	}
	// The v2 store keeps appending.
	if err := s.appendOne(newer, "t6", testevents.TicketOpened{Title: "v2 again"}); err != nil {
		t.Fatal(err)
	}

}

// Retiring an inline projection lifts the fence only once no process runs
// it: a store that still applies it records it again when it re-reads.
func TestInlineProjectionRetire(t *testing.T) {
	t.Parallel()
	s := newInlineFenceSetup(t)
	withP := s.store(t, postgres.Config{Inline: []postgres.InlineProjection{s.projection(t, 1, false)}})
	without := s.store(t, postgres.Config{})
	retire := func() bool {
		t.Helper()
		retired, err := postgres.RetireInlineProjection(s.ctx, s.pool, s.schema, "ticket_summary")
		if err != nil {
			t.Fatal(err)
		}
		return retired
	}

	// Retired while a store still runs it: that store's next reading
	// records it again, and the fence holds.
	if !retire() {
		t.Fatal("retire found no record")
	}
	if err := withP.RefreshInline(s.ctx); err != nil {
		t.Fatal(err)
	}
	if err := without.RefreshInline(s.ctx); err != nil {
		t.Fatal(err)
	}
	err := s.appendOne(without, "t1", testevents.TicketOpened{Title: "bypass"})
	wantInlineRefusal(t, err, postgres.InlineProjectionError{Projection: "ticket_summary", EventType: "ticket.opened", Recorded: 1, Have: 0})

	// Once nothing runs it (withP is not used again), retiring lifts the
	// fence for stores that re-read; a second retire finds nothing.
	if !retire() {
		t.Fatal("retire found no record after it was recorded again")
	}
	if retire() {
		t.Fatal("retire twice reported a record")
	}
	if err := without.RefreshInline(s.ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.appendOne(without, "t2", testevents.TicketOpened{Title: "after retire"}); err != nil {
		t.Fatalf("append after the projection was retired: %v", err)
	}
}

// Two definitions that share a version but handle different types are a
// forgotten version bump: the record takes the union, and the store whose
// definition lacks a recorded type is refused it.
func TestInlineProjectionSameVersionDifferentTypesRefused(t *testing.T) {
	t.Parallel()
	s := newInlineFenceSetup(t)
	narrow := s.store(t, postgres.Config{Inline: []postgres.InlineProjection{s.projection(t, 1, false)}})
	wide := s.store(t, postgres.Config{Inline: []postgres.InlineProjection{s.projection(t, 1, true)}})
	if err := narrow.RefreshInline(s.ctx); err != nil {
		t.Fatal(err)
	}
	err := s.appendOne(narrow, "t1", testevents.TicketClosed{})
	wantInlineRefusal(t, err, postgres.InlineProjectionError{Projection: "ticket_summary", EventType: "ticket.closed", Recorded: 1, Have: 1})
	if err := s.appendOne(narrow, "t2", testevents.TicketOpened{Title: "shared type"}); err != nil {
		t.Fatal(err)
	}
	if err := s.appendOne(wide, "t3", testevents.TicketClosed{}); err != nil {
		t.Fatal(err)
	}
}

func TestInlineProjectionVersionBelowOneRefused(t *testing.T) {
	t.Parallel()
	types := testevents.New()
	p := projection.NewInline("versioned")
	if err := p.SetVersion(0); !errors.Is(err, projection.ErrInvalidDefinition) {
		t.Fatalf("SetVersion(0): %v; want ErrInvalidDefinition", err)
	}
	_, err := postgres.New(context.Background(), pgtest.Pool(t), postgres.Config{Schema: pgtest.Schema(t), Registry: types.Registry, Inline: []postgres.InlineProjection{p}})
	if !errors.Is(err, projection.ErrInvalidDefinition) {
		t.Fatalf("store with an inline projection at version 0: %v", err)
	}
}
