package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/stores/postgres"
)

type fixture struct {
	ctx   context.Context
	types testevents.Types
	store *postgres.Store
}

func setup(t *testing.T, cfg ...postgres.Config) fixture {
	t.Helper()
	types := testevents.New()
	return fixture{ctx: context.Background(), types: types, store: pgtest.Store(t, types.Registry, cfg...)}
}

// appendTx appends in a transaction of its own and commits.
func (f fixture) appendTx(t *testing.T, stream projector.StreamRef, exp projector.ExpectedVersion, payloads ...any) postgres.AppendResult {
	t.Helper()
	var res postgres.AppendResult
	err := pgx.BeginFunc(f.ctx, f.store.Pool(), func(tx pgx.Tx) error {
		var err error
		res, err = f.store.Append(f.ctx, tx, stream, exp, payloads...)
		return err
	})
	if err != nil {
		t.Fatalf("append: %v", err)
	}
	return res
}

func TestAppendAndReadStream(t *testing.T) {
	t.Parallel()
	f := setup(t)
	s := projector.TenantStream("acme", "ticket", "t-1")
	ctx := projector.WithActor(projector.WithHeader(f.ctx, "trace", "abc"), "agent-7")
	var res postgres.AppendResult
	err := pgx.BeginFunc(ctx, f.store.Pool(), func(tx pgx.Tx) error {
		var err error
		res, err = f.store.Append(ctx, tx, s, projector.NoStream,
			testevents.TicketOpened{Title: "printer on fire"}, &testevents.TicketCommented{Body: "have you tried water", N: 1})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Version != 2 || len(res.Events) != 2 {
		t.Fatalf("result: version %d, %d events", res.Version, len(res.Events))
	}
	got, err := f.store.ReadStream(f.ctx, s, postgres.StreamQuery{})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 {
		t.Fatalf("read %d events, want 2", len(got))
	}
	for i, ev := range got {
		want := res.Events[i]
		if ev.ID != want.ID || ev.Version != int64(i+1) || ev.Position != want.Position || ev.Type != want.Type {
			t.Errorf("event %d: read %+v, appended %+v", i, ev, want)
		}
		if ev.Metadata.Actor != "agent-7" || ev.Metadata.Headers["trace"] != "abc" || ev.Metadata.CorrelationID == [16]byte{} {
			t.Errorf("event %d metadata: %+v", i, ev.Metadata)
		}
		if ev.Metadata.CorrelationID != got[0].Metadata.CorrelationID {
			t.Errorf("events of one append have different correlation ids")
		}
	}
	if p, ok := got[0].Payload.(testevents.TicketOpened); !ok || p.Title != "printer on fire" {
		t.Errorf("payload 0: %#v", got[0].Payload)
	}
	if p, ok := got[1].Payload.(testevents.TicketCommented); !ok || p.N != 1 {
		t.Errorf("payload 1: %#v", got[1].Payload)
	}
	if !got[0].Position.Less(got[1].Position) {
		t.Errorf("positions out of order: %v, %v", got[0].Position, got[1].Position)
	}

	// Version bounds.
	part, err := f.store.ReadStream(f.ctx, s, postgres.StreamQuery{FromVersion: 2})
	if err != nil || len(part) != 1 || part[0].Version != 2 {
		t.Fatalf("from version 2: %v %v", part, err)
	}
	v, err := f.store.StreamVersion(f.ctx, f.store.Pool(), s)
	if err != nil || v != 2 {
		t.Fatalf("stream version: %d %v", v, err)
	}
	if _, err := f.store.StreamVersion(f.ctx, f.store.Pool(), projector.TenantStream("acme", "ticket", "nope")); !errors.Is(err, projector.ErrNotFound) {
		t.Fatalf("missing stream version: %v, want ErrNotFound", err)
	}
}

func TestAppendExpectedVersions(t *testing.T) {
	t.Parallel()
	f := setup(t)
	s := projector.Stream("ticket", "t-2")
	opened := testevents.TicketOpened{Title: "x"}
	comment := testevents.TicketCommented{Body: "y"}

	tryAppend := func(exp projector.ExpectedVersion) error {
		return pgx.BeginFunc(f.ctx, f.store.Pool(), func(tx pgx.Tx) error {
			_, err := f.store.Append(f.ctx, tx, s, exp, comment)
			return err
		})
	}
	// Exact version on a missing stream fails and creates nothing.
	err := tryAppend(projector.ExactVersion(3))
	var ce *projector.ConcurrencyError
	if !errors.As(err, &ce) || !errors.Is(err, projector.ErrConcurrency) || ce.Actual != 0 || ce.Expected != 3 {
		t.Fatalf("exact version on missing stream: %v", err)
	}
	f.appendTx(t, s, projector.NoStream, opened)
	// NoStream on an existing stream.
	if err := tryAppend(projector.NoStream); !errors.As(err, &ce) || ce.Actual != 1 {
		t.Fatalf("NoStream on existing stream: %v", err)
	}
	// Stale exact version.
	f.appendTx(t, s, projector.ExactVersion(1), comment)
	if err := tryAppend(projector.ExactVersion(1)); !errors.As(err, &ce) || ce.Actual != 2 || ce.Expected != 1 {
		t.Fatalf("stale version: %v", err)
	}
	// Any appends whatever the version.
	if res := f.appendTx(t, s, projector.AnyVersion, comment, comment); res.Version != 4 {
		t.Fatalf("any: version %d, want 4", res.Version)
	}
	if err := tryAppend(projector.ExpectedVersion(-7)); !errors.Is(err, projector.ErrInvalidStream) || !strings.Contains(err.Error(), "append to stream __system__/") {
		t.Fatalf("expected version -7: %v", err)
	}
	// A stream that cannot be stored is named once, by its own error.
	bad := projector.Stream("ticket", "bad\xff")
	err = pgx.BeginFunc(f.ctx, f.store.Pool(), func(tx pgx.Tx) error {
		_, err := f.store.Append(f.ctx, tx, bad, projector.AnyVersion, opened)
		return err
	})
	if !errors.Is(err, projector.ErrInvalidStream) || strings.Count(err.Error(), "__system__/ticket/") != 1 {
		t.Fatalf("an unstorable stream id: %v", err)
	}
}

// The append has one statement per expected-version kind and shape (one
// event or many): each of the six must write the head and number the events
// from it, and refuse what its kind refuses, writing nothing.
func TestAppendEachStatement(t *testing.T) {
	t.Parallel()
	f := setup(t)
	comments := func(n int) []any {
		out := make([]any, n)
		for i := range out {
			out[i] = testevents.TicketCommented{Body: "c", N: i}
		}
		return out
	}
	tryAppend := func(s projector.StreamRef, exp projector.ExpectedVersion, n int) (postgres.AppendResult, error) {
		var res postgres.AppendResult
		err := pgx.BeginFunc(f.ctx, f.store.Pool(), func(tx pgx.Tx) error {
			var err error
			res, err = f.store.Append(f.ctx, tx, s, exp, comments(n)...)
			return err
		})
		return res, err
	}
	check := func(t *testing.T, s projector.StreamRef, res postgres.AppendResult, err error, from int64, n int) {
		t.Helper()
		if err != nil {
			t.Fatalf("append %d events at version %d: %v", n, from, err)
		}
		if res.Version != from+int64(n)-1 || len(res.Events) != n {
			t.Fatalf("result: version %d, %d events; want version %d, %d events", res.Version, len(res.Events), from+int64(n)-1, n)
		}
		got, err := f.store.ReadStream(f.ctx, s, postgres.StreamQuery{FromVersion: from})
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != n {
			t.Fatalf("read %d events from version %d, want %d", len(got), from, n)
		}
		for i, ev := range got {
			want := res.Events[i]
			if ev.ID != want.ID || ev.Version != from+int64(i) || ev.Position != want.Position ||
				ev.Payload.(testevents.TicketCommented).N != i {
				t.Errorf("event %d: read %+v, appended %+v", i, ev, want)
			}
			if i > 0 && !got[i-1].Position.Less(ev.Position) {
				t.Errorf("events %d and %d: positions %v, %v out of version order", i-1, i, got[i-1].Position, ev.Position)
			}
		}
	}
	refused := func(t *testing.T, s projector.StreamRef, err error, actual int64) {
		t.Helper()
		var ce *projector.ConcurrencyError
		if !errors.As(err, &ce) || ce.Actual != actual {
			t.Fatalf("append: %v, want a concurrency error at version %d", err, actual)
		}
		v, err := f.store.StreamVersion(f.ctx, f.store.Pool(), s)
		if actual == 0 {
			if !errors.Is(err, projector.ErrNotFound) {
				t.Fatalf("refused append left stream version %d (%v), want no stream", v, err)
			}
			return
		}
		if err != nil || v != actual {
			t.Fatalf("refused append left stream version %d (%v), want %d", v, err, actual)
		}
	}
	for _, n := range []int{1, 3} {
		t.Run(fmt.Sprintf("events=%d", n), func(t *testing.T) {
			id := func(name string) projector.StreamRef {
				return projector.Stream("ticket", fmt.Sprintf("%s-%d", name, n))
			}

			s := id("exact-missing")
			_, err := tryAppend(s, projector.ExactVersion(1), n)
			refused(t, s, err, 0)

			s = id("nostream")
			res, err := tryAppend(s, projector.NoStream, n)
			check(t, s, res, err, 1, n)
			_, err = tryAppend(s, projector.NoStream, n)
			refused(t, s, err, int64(n))
			res, err = tryAppend(s, projector.ExactVersion(int64(n)), n)
			check(t, s, res, err, int64(n)+1, n)
			_, err = tryAppend(s, projector.ExactVersion(int64(n)), n)
			refused(t, s, err, 2*int64(n))
			res, err = tryAppend(s, projector.AnyVersion, n)
			check(t, s, res, err, 2*int64(n)+1, n)

			s = id("any-missing")
			res, err = tryAppend(s, projector.AnyVersion, n)
			check(t, s, res, err, 1, n)
		})
	}
}

// Two transactions creating the same stream at once (NoStream): one wins,
// the other waits for it and is refused with the concurrency error, for
// either shape of the append.
func TestAppendConcurrentNoStream(t *testing.T) {
	t.Parallel()
	f := setup(t)
	for _, n := range []int{1, 2} {
		s := projector.Stream("ticket", fmt.Sprintf("create-race-%d", n))
		payloads := make([]any, n)
		for i := range payloads {
			payloads[i] = testevents.TicketOpened{Title: "x"}
		}
		first, err := f.store.Pool().Begin(f.ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = first.Rollback(f.ctx) }()
		if _, err := f.store.Append(f.ctx, first, s, projector.NoStream, payloads...); err != nil {
			t.Fatal(err)
		}
		second := make(chan error, 1)
		go func() {
			second <- pgx.BeginFunc(f.ctx, f.store.Pool(), func(tx pgx.Tx) error {
				_, err := f.store.Append(f.ctx, tx, s, projector.NoStream, payloads...)
				return err
			})
		}()
		// The second append waits on the first's uncommitted head row:
		// let it get there before the first commits.
		pgtest.Eventually(t, 5*time.Second, "second append waiting for the first", func() bool {
			var waiting bool
			err := f.store.Pool().QueryRow(f.ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity
				WHERE wait_event_type = 'Lock' AND position($1 in query) > 0)`, f.store.Schema()).Scan(&waiting)
			return err == nil && waiting
		})
		if err := first.Commit(f.ctx); err != nil {
			t.Fatal(err)
		}
		var ce *projector.ConcurrencyError
		if err := <-second; !errors.As(err, &ce) || ce.Actual != int64(n) {
			t.Fatalf("events=%d: second creator: %v, want a concurrency error at version %d", n, err, n)
		}
		if v, err := f.store.StreamVersion(f.ctx, f.store.Pool(), s); err != nil || v != int64(n) {
			t.Fatalf("events=%d: stream version %d (%v), want %d", n, v, err, n)
		}
	}
}

// TestAppendEveryQueryExecMode: the append passes its ids and types as
// parameters of its own types (append_params.go), which pgx must encode in
// every exec mode — those that learn the parameters' types from the server
// and those that send text of an unknown type (exec and simple protocol,
// the modes behind a connection pooler in transaction mode, where every
// append failed on the event id's [16]byte) — and what the append returns,
// metadata included, must be what the log holds.
func TestAppendEveryQueryExecMode(t *testing.T) {
	t.Parallel()
	types := testevents.New()
	for _, mode := range []pgx.QueryExecMode{
		pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe, pgx.QueryExecModeDescribeExec, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol,
	} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			// Metadata of every kind, so each parameter is sent in the mode.
			ctx := projector.WithHeader(projector.WithActor(projector.WithCausationID(context.Background(), uuid.New()), "ops \\ \"x\""), "k", "v")
			cfg := pgtest.PoolConfig(t)
			cfg.ConnConfig.DefaultQueryExecMode = mode
			store, err := postgres.New(ctx, pgtest.PoolFromConfig(t, cfg), postgres.Config{Schema: pgtest.Schema(t), Registry: types.Registry})
			if err != nil {
				t.Fatal(err)
			}
			f := fixture{ctx: ctx, types: types, store: store}
			s := projector.TenantStream("acme", "ticket", "t-1")
			var appended []projector.Event
			for _, payloads := range [][]any{
				{testevents.TicketOpened{Title: "printer on fire"}},
				{&testevents.TicketCommented{Body: `"quoted", \back\ {braces}`, N: 1}, testevents.TicketCommented{Body: "ünïcode", N: 2}, testevents.TicketClosed{}},
			} {
				res := f.appendTx(t, s, projector.ExactVersion(int64(len(appended))), payloads...)
				appended = append(appended, res.Events...)
			}
			got, err := store.ReadStream(ctx, s, postgres.StreamQuery{})
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(appended) {
				t.Fatalf("read %d events, appended %d", len(got), len(appended))
			}
			for i, ev := range got {
				want := appended[i]
				if ev.ID != want.ID || ev.Version != int64(i+1) || want.Version != ev.Version || ev.Position != want.Position ||
					ev.Type != want.Type || !reflect.DeepEqual(ev.Payload, want.Payload) || !ev.RecordedAt.Equal(want.RecordedAt) ||
					!reflect.DeepEqual(ev.Metadata, want.Metadata) {
					t.Errorf("event %d: read %+v, appended %+v", i, ev, want)
				}
			}
			// The merged log reads (a partition's buckets, a few types) are
			// pipelined with their planner settings: in every mode too.
			for p := range 2 {
				seg, err := postgres.SegmentOf(p, 2)
				if err != nil {
					t.Fatal(err)
				}
				want := 0
				if seg.Contains(postgres.StreamHash("acme", "ticket", "t-1")) {
					want = len(appended)
				}
				readLogN(t, ctx, store, postgres.LogQuery{Partition: seg}, want)
				if b, err := store.ReadLog(ctx, postgres.LogQuery{Partition: seg}); err != nil || len(b.Events) != want {
					t.Errorf("partition %s read %d events (%v), want %d", seg, len(b.Events), err, want)
				}
			}
			if got := readLogN(t, ctx, store, postgres.LogQuery{EventTypes: []string{"ticket.opened", "ticket.closed"}}, 2); len(got) != 2 ||
				got[0].ID != appended[0].ID || got[1].ID != appended[3].ID {
				t.Errorf("two types read %+v, want the first and the last event", got)
			}
		})
	}
}
