package rebuild_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/rebuild"
)

// poisonCounter counts events per stream like counter, in continuous mode:
// version 1 fails on tickets titled "v1-poison", and every version on
// tickets titled "poison" while poisoned is set.
func (e *env) poisonCounter(version int, poisoned *atomic.Bool) *projection.Async {
	p := projection.NewAsync("counter", projection.AsyncConfig{Version: version, Tables: []string{e.table},
		ErrorMode: projection.SkipApplyErrors, MaxAttempts: 1})
	must(projection.On(p, e.types.Opened, func(ctx context.Context, tx pgx.Tx, ev projector.Event, o testevents.TicketOpened) error {
		if (o.Title == "v1-poison" && version == 1) || (o.Title == "poison" && poisoned.Load()) {
			return fmt.Errorf("v%d cannot digest %s", version, o.Title)
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+projection.Table(ctx, e.table)+` AS c (stream_id, n, v) VALUES ($1, 1, $2)
			ON CONFLICT (stream_id) DO UPDATE SET n = c.n + 1, v = $2`, ev.Stream.ID, version)
		return err
	}))
	return p
}

// applied is how often the live model counted stream id.
func (e *env) applied(id string) int {
	e.t.Helper()
	var n int
	err := e.store.Pool().QueryRow(e.ctx, `SELECT coalesce((SELECT n FROM `+pgx.Identifier{e.schema, "counts"}.Sanitize()+` WHERE stream_id = $1), 0)`, id).Scan(&n)
	if err != nil {
		e.t.Fatal(err)
	}
	return n
}

// openDeadLetter returns the one open dead letter of the counter on stream
// id, of the given instance and model.
func (e *env) openDeadLetter(id, instance string, model int64) projection.DeadLetter {
	e.t.Helper()
	dls, err := projection.ListDeadLetters(e.ctx, e.store, projection.DeadLetterFilter{Consumer: "counter", Instance: instance, Status: projection.DeadLetterOpen})
	if err != nil {
		e.t.Fatal(err)
	}
	var out []projection.DeadLetter
	for _, dl := range dls {
		if dl.StreamID == id && dl.ModelRebuildID == model {
			out = append(out, dl)
		}
	}
	if len(out) != 1 {
		e.t.Fatalf("open dead letters of %s on %s: %+v, want one", instance, id, out)
	}
	return out[0]
}

// A dead letter recorded against a model that a rebuild replaced is never
// retried into the new model (the rebuild replayed its event: applied, or
// dead-lettered anew), so no event is applied twice; the dead letters the
// rebuild recorded itself are retried through the new version once it is
// live, and only by a binary of that version.
func TestDeadLetterRetryAfterRebuild(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	poisoned := &atomic.Bool{}
	poisoned.Store(true)
	v1, v2 := e.poisonCounter(1, poisoned), e.poisonCounter(2, poisoned)
	for _, s := range []struct{ id, title string }{{"old", "v1-poison"}, {"both", "poison"}, {"fine", "fine"}} {
		if err := pgx.BeginFunc(e.ctx, e.store.Pool(), func(tx pgx.Tx) error {
			_, err := e.store.Append(e.ctx, tx, projector.Stream("ticket", s.id), projector.NoStream, testevents.TicketOpened{Title: s.title})
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(e.ctx, 2*time.Minute)
	defer cancel()
	if err := e.dispatcher(v1).CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	oldOnly, oldBoth := e.openDeadLetter("old", projection.SharedInstance, 0), e.openDeadLetter("both", projection.SharedInstance, 0)

	// Blue/green to v2, held: v2 applies "old" and dead-letters "both" on
	// its shadow shard.
	e.dispatcher(v2)
	rb, err := rebuild.Request(e.ctx, e.store, "counter", rebuild.Options{Hold: true})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "the held rebuild to be ready", func() bool {
		r, err := rebuild.Current(e.ctx, e.store, "counter")
		return err == nil && r.Status == rebuild.Ready
	})
	shadow := e.openDeadLetter("both", projection.RebuildInstance, rb.ID)
	// Neither live nor superseded while its rebuild is still building.
	for _, model := range []string{projection.ModelLive, projection.ModelSuperseded} {
		dls, err := projection.ListDeadLetters(e.ctx, e.store, projection.DeadLetterFilter{Consumer: "counter", Instance: projection.RebuildInstance, Model: model})
		if err != nil || len(dls) != 0 {
			t.Fatalf("model %s before the switch lists the shadow's dead letter: %+v, %v", model, dls, err)
		}
	}
	poisoned.Store(false)
	if _, err := projection.RetryDeadLetter(e.ctx, e.store, v2, shadow.ID, nil); !errors.Is(err, projection.ErrDeadLetterSuperseded) ||
		!strings.Contains(err.Error(), "still ready") {
		t.Fatalf("retry of the shadow's dead letter before the switch: %v, want ErrDeadLetterSuperseded saying it is not live yet", err)
	}
	if err := rebuild.Switch(e.ctx, e.store, "counter"); err != nil {
		t.Fatal(err)
	}
	if final, err := rebuild.Wait(ctx, e.store, "counter", 10*time.Millisecond, nil); err != nil || final.Status != rebuild.Switched {
		t.Fatalf("after switch: %+v, %v", final, err)
	}
	if n := e.applied("old"); n != 1 {
		t.Fatalf("v2's replay counted the event v1 dead-lettered %d times, want 1", n)
	}

	// Listed by model: the old model's two are superseded, the one the
	// rebuild recorded (moved to the live shard) is live.
	for model, want := range map[string][]int64{projection.ModelSuperseded: {oldOnly.ID, oldBoth.ID}, projection.ModelLive: {shadow.ID}} {
		dls, err := projection.ListDeadLetters(e.ctx, e.store, projection.DeadLetterFilter{Consumer: "counter", Model: model})
		if err != nil || len(dls) != len(want) {
			t.Fatalf("model %s: %+v, %v; want %v", model, dls, err, want)
		}
		for i, dl := range dls {
			if dl.ID != want[i] {
				t.Fatalf("model %s: %+v; want %v", model, dls, want)
			}
		}
	}

	// The old model's dead letters: refused, by either binary, and as a
	// request; nothing applied.
	for _, p := range []*projection.Async{v2, v1} {
		_, err := projection.RetryDeadLetter(e.ctx, e.store, p, oldOnly.ID, nil)
		if !errors.Is(err, projection.ErrDeadLetterSuperseded) || !errors.Is(err, projector.ErrInvalidTransition) ||
			!strings.Contains(err.Error(), fmt.Sprintf("rebuild %d (blue-green, v2) replaced", rb.ID)) || !strings.Contains(err.Error(), "discard it") {
			t.Fatalf("retry (v%d) of a dead letter of the replaced model: %v", p.Config().Version, err)
		}
	}
	if err := projection.RequestDeadLetterRetry(e.ctx, e.store, []int64{oldBoth.ID}); !errors.Is(err, projection.ErrDeadLetterSuperseded) {
		t.Fatalf("retry request of a dead letter of the replaced model: %v", err)
	}
	if n := e.applied("old"); n != 1 {
		t.Fatalf("the refused retry applied the event again: counted %d times", n)
	}

	// The rebuild's own dead letter moved to the live shard with the
	// switch: a binary of the old version may not retry it, v2 does, once.
	moved := e.openDeadLetter("both", projection.SharedInstance, rb.ID)
	if moved.ID != shadow.ID {
		t.Fatalf("open dead letter on the live shard after the switch: %d, want the shadow's %d", moved.ID, shadow.ID)
	}
	if _, err := projection.RetryDeadLetter(e.ctx, e.store, v1, moved.ID, nil); !errors.Is(err, projection.ErrWrongVersion) {
		t.Fatalf("retry by a v1 binary of a v2 model: %v, want ErrWrongVersion", err)
	}
	if res, err := projection.RetryDeadLetter(e.ctx, e.store, v2, moved.ID, nil); err != nil || !res.Resolved {
		t.Fatalf("retry of the live model's dead letter: %+v, %v", res, err)
	}
	if n := e.applied("both"); n != 1 {
		t.Fatalf("counted %d times after the retry, want 1", n)
	}

	// In place: the replay applies "both" again from scratch, so the dead
	// letter resolved before is history and an open one from before the
	// rebuild is refused too.
	poisoned.Store(true)
	if err := pgx.BeginFunc(e.ctx, e.store.Pool(), func(tx pgx.Tx) error {
		_, err := e.store.Append(e.ctx, tx, projector.Stream("ticket", "late"), projector.NoStream, testevents.TicketOpened{Title: "poison"})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "the late poison to be dead-lettered", func() bool {
		dls, err := projection.ListDeadLetters(e.ctx, e.store, projection.DeadLetterFilter{Consumer: "counter", Status: projection.DeadLetterOpen})
		for _, dl := range dls {
			if dl.StreamID == "late" {
				return true
			}
		}
		return err != nil
	})
	late := e.openDeadLetter("late", projection.SharedInstance, rb.ID)
	poisoned.Store(false)
	inPlace, err := rebuild.Request(e.ctx, e.store, "counter", rebuild.Options{Mode: rebuild.InPlace})
	if err != nil {
		t.Fatal(err)
	}
	if final, err := rebuild.Wait(ctx, e.store, "counter", 10*time.Millisecond, nil); err != nil || final.Status != rebuild.Done {
		t.Fatalf("in-place rebuild: %+v, %v", final, err)
	}
	if _, err := projection.RetryDeadLetter(e.ctx, e.store, v2, late.ID, nil); !errors.Is(err, projection.ErrDeadLetterSuperseded) ||
		!strings.Contains(err.Error(), fmt.Sprintf("rebuild %d (in-place, v2)", inPlace.ID)) {
		t.Fatalf("retry of a dead letter from before an in-place rebuild: %v", err)
	}
	if n := e.applied("late"); n != 1 {
		t.Fatalf("late counted %d times, want 1 (by the in-place replay)", n)
	}
}

// A partial rebuild that now applies a dead-lettered event resolves its
// dead letter in the same transaction, so a retry cannot apply it twice; a
// dead letter of an event that still fails stays open.
func TestPartialRebuildResolvesAppliedDeadLetters(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	poisoned := &atomic.Bool{}
	poisoned.Store(true)
	p := projection.NewAsync("counter", projection.AsyncConfig{Tables: []string{e.table}, ErrorMode: projection.SkipApplyErrors, MaxAttempts: 1,
		ResetScope: func(ctx context.Context, tx pgx.Tx, s projection.Scope) error {
			_, err := tx.Exec(ctx, `DELETE FROM `+projection.Table(ctx, e.table)+` WHERE stream_id = $1`, s.StreamID)
			return err
		}})
	must(projection.On(p, e.types.Opened, func(ctx context.Context, tx pgx.Tx, ev projector.Event, o testevents.TicketOpened) error {
		if o.Title == "poison" && poisoned.Load() {
			return errors.New("cannot digest poison")
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+projection.Table(ctx, e.table)+` AS c (stream_id, n, v) VALUES ($1, 1, 1)
			ON CONFLICT (stream_id) DO UPDATE SET n = c.n + 1`, ev.Stream.ID)
		return err
	}))
	for _, id := range []string{"a", "b"} {
		if err := pgx.BeginFunc(e.ctx, e.store.Pool(), func(tx pgx.Tx) error {
			_, err := e.store.Append(e.ctx, tx, projector.Stream("ticket", id), projector.NoStream, testevents.TicketOpened{Title: "poison"})
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	if err := e.dispatcher(p).CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	a, b := e.openDeadLetter("a", projection.SharedInstance, 0), e.openDeadLetter("b", projection.SharedInstance, 0)
	poisoned.Store(false)
	res, err := rebuild.Partial(e.ctx, e.store, p, projection.StreamScope(projector.Stream("ticket", "a")), rebuild.PartialOptions{})
	if err != nil || res.Events != 1 || res.ResolvedDeadLetters != 1 {
		t.Fatalf("partial rebuild of a: %+v, %v", res, err)
	}
	if _, err := projection.RetryDeadLetter(e.ctx, e.store, p, a.ID, nil); !errors.Is(err, projector.ErrInvalidTransition) || !strings.Contains(err.Error(), "resolved already") {
		t.Fatalf("retry of the dead letter the partial rebuild applied: %v, want a refusal", err)
	}
	if n := e.applied("a"); n != 1 {
		t.Fatalf("a counted %d times, want 1", n)
	}
	if dl, _, err := projection.GetDeadLetter(e.ctx, e.store, b.ID); err != nil || dl.Status != projection.DeadLetterOpen {
		t.Fatalf("the dead letter outside the scope: %+v, %v", dl, err)
	}
}
