package postgres_test

import (
	"context"
	"errors"
	"testing"

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
	if err := tryAppend(projector.ExpectedVersion(-7)); !errors.Is(err, projector.ErrInvalidStream) {
		t.Fatalf("expected version -7: %v", err)
	}
}
