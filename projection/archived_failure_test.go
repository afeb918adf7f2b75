package projection_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

// A consumer registered after `streams archive` reads the archived events
// and may fail on one. These tests hold that skip, dead-letter show and
// dead-letter retry find such an event in the archive, as they find a hot
// one, instead of taking it for pruned.

// archiveAll archives the named ticket streams, every one of them.
func (e *env) archiveAll(streams ...string) {
	e.t.Helper()
	refs := make([]projector.StreamRef, len(streams))
	for i, s := range streams {
		refs[i] = projector.Stream("ticket", s)
	}
	res, err := e.store.Archive(e.ctx, postgres.ArchiveOptions{Streams: refs})
	if err != nil || res.Streams != int64(len(streams)) {
		e.t.Fatalf("archive %v: %+v, %v; want every stream archived", streams, res, err)
	}
}

// A halt-mode consumer that dies on an archived event is skipped past it:
// the dead letter is recorded and the shard goes on (it was refused as "no
// longer in the log", leaving the shard stuck).
func TestSkipArchivedFailingEvent(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.traceTable()
	e.appendOne("a", projector.NoStream, testevents.TicketOpened{Title: "fine"})
	bad := e.appendOne("b", projector.NoStream, testevents.TicketOpened{Title: "fine"}, testevents.TicketOpened{Title: "poison"})[1]
	e.appendOne("c", projector.NoStream, testevents.TicketOpened{Title: "fine"})
	e.archiveAll("a", "b", "c")

	var failing atomic.Bool
	failing.Store(true)
	late := poisoned(e, "late", projection.AsyncConfig{MaxAttempts: 1}, &failing)
	e.dispatcher(projection.Config{Projections: []*projection.Async{late}})
	admin := projection.NewAdmin(e.store)
	eventually(t, time.Minute, "the late shard to die on the archived poison", func() bool {
		return e.status(admin, "late").Status == projection.StatusDead
	})
	if st := e.status(admin, "late"); st.FailedEventID != bad.ID {
		t.Fatalf("dead at %s, want the archived poison %s", st.FailedEventID, bad.ID)
	}
	if err := admin.Skip(e.ctx, projection.ShardID{Consumer: "late"}); err != nil {
		t.Fatalf("skip of an archived failing event: %v", err)
	}
	eventually(t, time.Minute, "the skipped shard to catch up", func() bool {
		n, _ := e.counts("late")
		return n["c"] == 1
	})
	e.checkCounts("late", map[string]int64{"a": 1, "b": 1, "c": 1})
	dls, err := projection.ListDeadLetters(e.ctx, e.store, projection.DeadLetterFilter{Consumer: "late"})
	if err != nil || len(dls) != 1 || dls[0].EventID != bad.ID || dls[0].Reason != "skipped" || dls[0].Version != 2 {
		t.Fatalf("dead letters: %+v, %v; want the archived poison, skipped", dls, err)
	}
}

// A skip never passes an archived event the shard did not apply: a shard
// whose cursor is behind archived events before its failing one is refused,
// as it is for hot ones (the check read the hot log only, so the skip
// passed them).
func TestSkipRefusesUnappliedArchivedEvents(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	consumers := e.store.Table("projector_consumers")
	admin := projection.NewAdmin(e.store)
	// The failing event archived, and hot: what lies between is archived
	// either way.
	for _, archiveFailing := range []bool{true, false} {
		name := fmt.Sprint("behind-", archiveFailing)
		e.appendOne(name+"-a", projector.NoStream, testevents.TicketOpened{Title: "fine"})
		bad := e.appendOne(name+"-b", projector.NoStream, testevents.TicketOpened{Title: "poison"})[0]
		if archiveFailing {
			e.archiveAll(name+"-a", name+"-b")
		} else {
			e.archiveAll(name + "-a")
		}
		e.exec(`INSERT INTO `+consumers+` (name, instance_id, status, attempts, last_error, last_error_at, failed_tx_id, failed_seq, failed_event_id)
			VALUES ($1, '__shared__', 'dead', 3, 'boom', now(), $2, $3, $4)`, name, bad.Position.TxID, bad.Position.Seq, bad.ID)
		err := admin.Skip(e.ctx, projection.ShardID{Consumer: name})
		if !errors.Is(err, projector.ErrInvalidTransition) || !strings.Contains(err.Error(), "were not applied") {
			t.Errorf("%s: skip past an unapplied archived event: %v, want a refusal saying events were not applied", name, err)
		}
		if st := e.status(admin, name); st.Status != projection.StatusDead || st.Cursor != (projector.Position{}) {
			t.Errorf("%s: a refused skip moved the shard: %+v", name, st)
		}
		if err := admin.Disable(e.ctx, projection.ShardID{Consumer: name}); err != nil { // out of the next archive's way
			t.Fatal(err)
		}
	}
}

// A dead letter of an archived event shows its event, and a retry, in this
// process or requested, finds it (both read it as pruned, and the advice
// was to discard it, losing the event). The stream's later archived event
// was applied, so the retry applied out of order.
func TestDeadLetterOfArchivedEvent(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.traceTable()
	// One poison at version 2 (read as missing), one at version 1 (read
	// as the archive marker).
	atTwo := e.appendOne("p", projector.NoStream, testevents.TicketOpened{Title: "fine"}, testevents.TicketOpened{Title: "poison"},
		testevents.TicketCommented{Body: "later"})[1]
	atOne := e.appendOne("q", projector.NoStream, testevents.TicketOpened{Title: "poison"})[0]
	e.archiveAll("p", "q")

	var failing atomic.Bool
	failing.Store(true)
	p := poisoned(e, "tolerant", projection.AsyncConfig{ErrorMode: projection.SkipApplyErrors, MaxAttempts: 1}, &failing)
	e.catchUp(e.dispatcher(projection.Config{Projections: []*projection.Async{p}}))
	dls, err := projection.ListDeadLetters(e.ctx, e.store, projection.DeadLetterFilter{Consumer: "tolerant"})
	if err != nil || len(dls) != 2 || dls[0].EventID != atTwo.ID || dls[1].EventID != atOne.ID {
		t.Fatalf("dead letters: %+v, %v; want the two archived poisons", dls, err)
	}
	for _, dl := range dls {
		for _, get := range []func(context.Context, *postgres.Store, int64) (projection.DeadLetter, *projector.Event, error){
			projection.GetDeadLetter, projection.GetDeadLetterRaw,
		} {
			if _, ev, err := get(e.ctx, e.store, dl.ID); err != nil || ev == nil || ev.ID != dl.EventID {
				t.Fatalf("show dead letter %d of an archived event: %v, %v; want the event", dl.ID, ev, err)
			}
		}
	}
	if err := projection.RequestDeadLetterRetry(e.ctx, e.store, []int64{dls[1].ID}); err != nil {
		t.Fatalf("request a retry of an archived event: %v", err)
	}
	failing.Store(false)
	res, err := projection.RetryDeadLetter(e.ctx, e.store, p, dls[0].ID, nil)
	if err != nil || !res.Resolved || !res.OutOfOrder {
		t.Fatalf("retry of an archived event: %+v, %v; want it resolved, out of order", res, err)
	}
	if n := e.traced("tolerant", atTwo.ID); n != 1 {
		t.Fatalf("the archived poison's write was kept %d times, want once (by the retry)", n)
	}
}

// A skip of an archived failing event racing an unarchive of its stream
// finds the event in one table or the other and records it: each of its
// reads takes both tables in one statement, so in one snapshot, and the
// unarchive moves the stream in one transaction. Every round, a fresh
// stream is archived under a disabled shard, the shard is made dead at its
// event, and the skip and the unarchive start together.
func TestSkipArchivedRacingUnarchive(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	consumers := e.store.Table("projector_consumers")
	admin := projection.NewAdmin(e.store)
	for round := range 12 {
		name, stream := fmt.Sprintf("racer%d", round), fmt.Sprintf("r%d", round)
		ev := e.appendOne(stream, projector.NoStream, testevents.TicketOpened{Title: "poison"})[0]
		// Right before the event: no event lies between, in either table.
		e.exec(`INSERT INTO `+consumers+` (name, instance_id, status, cursor_tx_id, cursor_seq) VALUES ($1, '__shared__', 'disabled', $2, $3)`,
			name, ev.Position.TxID, ev.Position.Seq-1)
		e.archiveAll(stream)
		e.exec(`UPDATE `+consumers+` SET status = 'dead', attempts = 1, last_error = 'boom', last_error_at = now(),
			failed_tx_id = $2, failed_seq = $3, failed_event_id = $4 WHERE name = $1`, name, ev.Position.TxID, ev.Position.Seq, ev.ID)

		start := make(chan struct{})
		unarchived := make(chan error, 1)
		go func() {
			<-start
			_, err := e.store.Unarchive(e.ctx, postgres.ArchiveOptions{Streams: []projector.StreamRef{projector.Stream("ticket", stream)}})
			unarchived <- err
		}()
		close(start)
		err := admin.Skip(e.ctx, projection.ShardID{Consumer: name})
		if uerr := <-unarchived; uerr != nil {
			t.Fatalf("round %d: unarchive: %v", round, uerr)
		}
		if err != nil {
			t.Fatalf("round %d: skip racing an unarchive: %v", round, err)
		}
		dls, err := projection.ListDeadLetters(e.ctx, e.store, projection.DeadLetterFilter{Consumer: name})
		if err != nil || len(dls) != 1 || dls[0].EventID != ev.ID {
			t.Fatalf("round %d: dead letters %+v, %v; want the skipped event's", round, dls, err)
		}
		if st := e.status(admin, name); st.Cursor != ev.Position || st.Status != projection.StatusIdle {
			t.Fatalf("round %d: after the skip: %+v", round, st)
		}
		// Out of the next round's way: an idle shard behind its stream
		// would hold the archive back.
		if err := admin.Disable(e.ctx, projection.ShardID{Consumer: name}); err != nil {
			t.Fatal(err)
		}
	}
}
