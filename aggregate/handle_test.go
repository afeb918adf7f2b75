package aggregate_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/aggregate"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/stores/postgres"
)

// tenantRecorder is an inline projection that records the tenant setting of
// the transaction each append runs in.
type tenantRecorder struct{ table string }

func (r tenantRecorder) Name() string { return "tenant_recorder" }

func (r tenantRecorder) Validate(*projector.Registry) error { return nil }

func (r tenantRecorder) ApplyInline(ctx context.Context, tx pgx.Tx, events []projector.Event) error {
	_, err := tx.Exec(ctx, `INSERT INTO `+r.table+` VALUES ($1, current_setting('projector.tenant_id', true))`, events[0].Stream.ID)
	return err
}

var errRefused = errors.New("ticket is closed")

func TestHandle(t *testing.T) {
	t.Parallel()
	types := testevents.New()
	schema := pgtest.Schema(t)
	recorder := tenantRecorder{table: pgx.Identifier{schema, "seen_tenants"}.Sanitize()}
	store, err := postgres.New(context.Background(), pgtest.Pool(t), postgres.Config{
		Schema: schema, Registry: types.Registry, Inline: []postgres.InlineProjection{recorder},
	})
	if err != nil {
		t.Fatal(err)
	}
	f := fixture{ctx: context.Background(), types: types, store: store}
	if _, err := store.Pool().Exec(f.ctx, `CREATE TABLE `+recorder.table+` (stream_id text, tenant text)`); err != nil {
		t.Fatal(err)
	}
	tickets := f.repo(t, aggregate.Snapshots{})
	comment := func(_ context.Context, cur aggregate.Loaded[Ticket]) ([]any, error) {
		switch {
		case !cur.Exists():
			return []any{testevents.TicketOpened{Title: "opened by a command"}}, nil
		case !cur.State.Open:
			return nil, errRefused
		case cur.State.Comments >= 2:
			return nil, nil // enough said: nothing to change
		}
		return []any{testevents.TicketCommented{Body: "c"}}, nil
	}
	s := projector.TenantStream("acme", "ticket", "cmd")

	// Creates the stream, then comments, then decides nothing changes.
	for i, want := range []struct {
		version int64
		events  int
	}{{1, 1}, {2, 1}, {3, 1}, {3, 0}} {
		res, err := tickets.Handle(f.ctx, s, comment)
		if err != nil {
			t.Fatalf("command %d: %v", i, err)
		}
		if res.Version != want.version || len(res.Events) != want.events || res.Attempts != 1 || res.Stream != s {
			t.Fatalf("command %d: version %d, %d events, %d attempts; want version %d, %d events, 1 attempt", i, res.Version, len(res.Events), res.Attempts, want.version, want.events)
		}
		if got, err := tickets.Load(f.ctx, s); err != nil || got.State != res.State || got.Version != res.Version {
			t.Fatalf("command %d: result %+v, load %+v %v", i, res.Loaded, got, err)
		}
	}

	// Inline projections ran in a transaction scoped to the stream's tenant.
	rows, err := store.Pool().Query(f.ctx, `SELECT DISTINCT tenant FROM `+recorder.table)
	if err != nil {
		t.Fatal(err)
	}
	tenants, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(tenants) != 1 || tenants[0] != "acme" {
		t.Fatalf("inline projections saw tenants %v (%v), want [acme]", tenants, err)
	}

	// A refusal is returned as is, after one attempt, and appends nothing.
	closed := projector.Stream("ticket", "closed")
	f.appendTx(t, closed, projector.NoStream, testevents.TicketOpened{Title: "x"}, testevents.TicketClosed{})
	res, err := tickets.Handle(f.ctx, closed, comment)
	// Never retried, so the message names no retry budget.
	if !errors.Is(err, errRefused) || res.Attempts != 1 || strings.Contains(err.Error(), "attempt") {
		t.Fatalf("refused command: %v after %d attempts, want errRefused after 1, with no attempt count", err, res.Attempts)
	}

	// A decide that asks for a retry is retried up to MaxAttempts.
	var calls atomic.Int32
	res, err = tickets.Handle(f.ctx, s, func(context.Context, aggregate.Loaded[Ticket]) ([]any, error) {
		calls.Add(1)
		return nil, fmt.Errorf("stale read model: %w", projector.ErrConcurrency)
	}, aggregate.HandleOptions{MaxAttempts: 3, Backoff: time.Microsecond})
	if !errors.Is(err, projector.ErrConcurrency) || calls.Load() != 3 || res.Attempts != 3 {
		t.Fatalf("always-conflicting command: %v, %d calls, %d attempts; want ErrConcurrency after 3", err, calls.Load(), res.Attempts)
	}
	if v, _ := store.StreamVersion(f.ctx, store.Pool(), s); v != 3 {
		t.Fatalf("failed commands moved the stream to version %d", v)
	}
}

// Many goroutines run commands on one stream at once: with retries every
// command succeeds exactly once and the final version is the number of
// commands, optimistically (colliding and retrying) and exclusively
// (queueing).
func TestHandleRetriesUntilAllSucceed(t *testing.T) {
	t.Parallel()
	f := setup(t)
	tickets := f.repo(t, aggregate.Snapshots{Every: 10})
	const goroutines, each = 8, 8
	for _, exclusive := range []bool{false, true} {
		t.Run(fmt.Sprintf("exclusive=%v", exclusive), func(t *testing.T) {
			s := projector.Stream("ticket", fmt.Sprintf("hot-%v", exclusive))
			f.appendTx(t, s, projector.NoStream, testevents.TicketOpened{Title: "hot"})
			opts := aggregate.HandleOptions{MaxAttempts: 1000, Backoff: time.Millisecond, MaxBackoff: 20 * time.Millisecond, Exclusive: exclusive}
			var attempts atomic.Int64
			errs := make(chan error, goroutines*each)
			var wg sync.WaitGroup
			for g := range goroutines {
				wg.Go(func() {
					for i := range each {
						n := g*each + i
						res, err := tickets.Handle(f.ctx, s, func(_ context.Context, cur aggregate.Loaded[Ticket]) ([]any, error) {
							if !cur.State.Open {
								return nil, errRefused
							}
							return []any{testevents.TicketCommented{Body: fmt.Sprintf("command %d", n), N: n}}, nil
						}, opts)
						attempts.Add(int64(res.Attempts))
						if err == nil && (len(res.Events) != 1 || res.Events[0].Version != res.Version) {
							err = fmt.Errorf("command %d: result version %d with %d events", n, res.Version, len(res.Events))
						}
						if err != nil {
							errs <- err
						}
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			got, err := tickets.Load(f.ctx, s)
			if err != nil {
				t.Fatal(err)
			}
			if got.Version != 1+goroutines*each || got.State.Comments != goroutines*each {
				t.Fatalf("after %d commands: version %d, %d comments; want version %d", goroutines*each, got.Version, got.State.Comments, 1+goroutines*each)
			}
			events, err := f.store.ReadStream(f.ctx, s, postgres.StreamQuery{FromVersion: 2})
			if err != nil {
				t.Fatal(err)
			}
			seen := map[int]bool{}
			for _, ev := range events {
				n := ev.Payload.(testevents.TicketCommented).N
				if seen[n] {
					t.Fatalf("command %d appended twice", n)
				}
				seen[n] = true
			}
			t.Logf("%d commands took %d attempts", goroutines*each, attempts.Load())
			if !exclusive && attempts.Load() == goroutines*each {
				t.Fatal("no command collided: the schedule does not exercise retries, so this test proves nothing")
			}
		})
	}
}

// Under a tenant role (no superuser, no BYPASSRLS), Handle still locks,
// appends and writes snapshots: GrantTenantRole covers every table it
// touches. A missing grant on snapshots would only be logged, so the test
// counts the snapshot rows.
func TestHandleUnderTenantRole(t *testing.T) {
	t.Parallel()
	types := testevents.New()
	schema := pgtest.Schema(t)
	pool := pgtest.Pool(t)
	ctx := context.Background()
	role, _ := pgtest.TenantRole(t, schema)
	store, err := postgres.New(ctx, pool, postgres.Config{Schema: schema, Registry: types.Registry, TenantRole: role})
	if err != nil {
		t.Fatal(err)
	}
	f := fixture{ctx: ctx, types: types, store: store}
	var logged pgtest.SyncBuffer
	tickets, err := aggregate.New(store, aggregate.Config[Ticket]{
		Name: "ticket", Folds: ticketFolds(types), Snapshots: aggregate.Snapshots{Every: 1, Keep: 1},
		Logger: slog.New(slog.NewTextHandler(&logged, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	s := projector.TenantStream("acme", "ticket", "scoped")
	for i := range 3 {
		_, err := tickets.Handle(ctx, s, func(_ context.Context, cur aggregate.Loaded[Ticket]) ([]any, error) {
			if !cur.Exists() {
				return []any{testevents.TicketOpened{Title: "scoped"}}, nil
			}
			return []any{testevents.TicketCommented{Body: fmt.Sprint(i)}}, nil
		}, aggregate.HandleOptions{Exclusive: true})
		if err != nil {
			t.Fatalf("command %d as the tenant role: %v", i, err)
		}
	}
	if rows := snapshotRows(t, f, s); len(rows) != 1 || rows[0].version != 3 {
		t.Fatalf("snapshots %+v, want one at version 3 (log: %s)", rows, logged.String())
	}
	got, err := tickets.Load(ctx, s)
	if err != nil || got.Version != 3 || got.FromSnapshot != 3 {
		t.Fatalf("load: %+v, %v", got, err)
	}
}
