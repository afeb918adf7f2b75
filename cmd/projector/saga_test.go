package main_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/saga"
	"github.com/projectorhq/projector/saga/sagatest"
)

// `saga list`, `saga show` and `saga prune` against instances a real saga
// made: the filters combine, JSON is what the table shows, bad flags exit
// 2 and a missing instance exits 1, prune deletes only completed instances.
func TestSagaCommands(t *testing.T) {
	t.Parallel()
	ty := testevents.New()
	var mu sync.Mutex
	now := sagatest.Start
	clock := func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		return now
	}
	type state struct{ Comments int }
	s := saga.New[state]("tickets", saga.Config{Now: clock})
	must := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	must(saga.StartOn(s, ty.Opened, saga.ByStream, func(_ context.Context, in *saga.Instance[state], _ projector.Event, _ testevents.TicketOpened) error {
		in.After("remind", time.Hour)
		return nil
	}))
	must(saga.On(s, ty.Commented, saga.ByStream, func(_ context.Context, in *saga.Instance[state], _ projector.Event, _ testevents.TicketCommented) error {
		in.State.Comments++
		return nil
	}))
	must(saga.On(s, ty.Closed, saga.ByStream, func(_ context.Context, in *saga.Instance[state], _ projector.Event, _ testevents.TicketClosed) error {
		in.Complete()
		return nil
	}))
	must(saga.OnTimeout(s, "remind", func(context.Context, *saga.Instance[state], saga.Timeout) error { return nil }))
	store := pgtest.Store(t, ty.Registry)
	live := sagatest.Run(t, store, s)
	ctx := context.Background()
	add := func(id string, payloads ...any) {
		t.Helper()
		must(pgx.BeginFunc(ctx, store.Pool(), func(tx pgx.Tx) error {
			_, err := store.Append(ctx, tx, projector.Stream("ticket", id), projector.AnyVersion, payloads...)
			return err
		}))
	}
	add("t-1", testevents.TicketOpened{Title: "a"}, testevents.TicketCommented{Body: "x"})
	add("t-2", testevents.TicketOpened{Title: "b"}, testevents.TicketClosed{})
	add("t-3", testevents.TicketOpened{Title: "c"})
	live.Settle(ctx)
	env := []string{"PROJECTOR_DATABASE_URL=" + pgtest.URL(t), "PROJECTOR_SCHEMA=" + store.Schema()}

	r := run(t, env, "saga", "list", "tickets", "-o", "json")
	var all []saga.InstanceInfo
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &all) != nil || len(all) != 3 {
		t.Fatalf("list: %+v", r)
	}
	r = run(t, env, "saga", "list", "tickets", "--status", "completed", "-o", "json")
	var done []saga.InstanceInfo
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &done) != nil || len(done) != 1 || done[0].Key != "t-2" {
		t.Fatalf("list --status completed: %+v", r)
	}
	r = run(t, env, "saga", "list", "tickets", "--status", "active", "--tenant", "nobody", "-o", "json")
	if r.code != 0 || strings.TrimSpace(r.stdout) != "[]" {
		t.Fatalf("list with two filters that match nothing: %+v", r)
	}
	r = run(t, env, "saga", "list", "tickets", "--status", "active,completed")
	if r.code != 0 || !strings.Contains(r.stdout, "KEY") || strings.Count(r.stdout, "t-") != 3 {
		t.Fatalf("list table: %+v", r)
	}

	r = run(t, env, "saga", "show", "tickets", "t-1", "-o", "json")
	var in saga.InstanceDetail
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &in) != nil {
		t.Fatalf("show: %+v", r)
	}
	var st state
	if err := json.Unmarshal(in.State, &st); err != nil {
		t.Fatal(err)
	}
	if in.Version != 2 || len(in.Steps) != 2 || len(in.Timeouts) != 1 || in.Timeouts[0].Name != "remind" ||
		!in.Timeouts[0].DueAt.Equal(sagatest.Start.Add(time.Hour)) || st.Comments != 1 {
		t.Fatalf("show t-1: %+v", in)
	}
	r = run(t, env, "saga", "show", "tickets", "t-1")
	for _, want := range []string{"Pending timeouts:", "remind", "ticket.opened", "ticket/t-1"} {
		if r.code != 0 || !strings.Contains(r.stdout, want) {
			t.Fatalf("show table lacks %q: %+v", want, r)
		}
	}
	if !strings.Contains(r.stdout, "Appended events: none\n") {
		t.Fatalf("show of an instance that appended nothing: %+v", r)
	}

	wantError(t, run(t, env, "saga", "show", "tickets", "nope"), 1, `no instance "nope"`)
	wantError(t, run(t, env, "saga", "list", "tickets", "--status", "done"), 2, "--status")
	wantError(t, run(t, env, "saga", "list", "tickets", "--limit", "0"), 2, "--limit")
	wantError(t, run(t, env, "saga", "list", "tickets", "--limit", "10001"), 2, "--limit")
	wantError(t, run(t, env, "saga", "list"), 2, "missing NAME")
	wantError(t, run(t, env, "saga", "prune"), 2, "--older-than")
	wantError(t, run(t, env, "saga", "prune", "--older-than", "-1h"), 2, "--older-than")

	r = run(t, env, "saga", "prune", "--older-than", "1ms")
	if r.code != 0 || !strings.Contains(r.stdout, "pruned 1 ") {
		t.Fatalf("prune: %+v", r)
	}
	r = run(t, env, "saga", "list", "tickets", "-o", "json")
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &all) != nil || len(all) != 2 {
		t.Fatalf("after prune, list: %+v", r)
	}
}
