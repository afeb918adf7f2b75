package rebuild_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/rebuild"
	"github.com/projectorhq/projector/stores/postgres"
)

// archiveTickets archives every ticket stream last appended to more than a
// nanosecond ago, as `streams archive --stream-type ticket --older-than
// 1ns` does, and returns how many events moved.
func archiveTickets(t *testing.T, store *postgres.Store) int64 {
	t.Helper()
	res, err := store.Archive(context.Background(), postgres.ArchiveOptions{StreamType: "ticket", OlderThan: time.Nanosecond})
	if err != nil {
		t.Fatal(err)
	}
	return res.Events
}

// Promise 9 for archiving against a rebuild: a rebuild request waiting for
// the live shard's lock while `streams archive` moves events the
// projection reads (the live cursor has passed them) must be refused with
// ErrArchived, since the replay reads the hot log only; afterwards, with
// nothing racing, the request is refused the same way until the streams
// are unarchived, and then accepted.
func TestRequestRacingArchiveIsRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	d := e.dispatcher(e.counter(1, projection.AsyncConfig{}))
	for i := range 25 {
		e.appendBatch(t, i, 2)
	}
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	if err := d.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	release := holdShardLock(t, e.store, "counter")
	done := make(chan error, 1)
	go func() {
		_, err := rebuild.Request(e.ctx, e.store, "counter", rebuild.Options{Mode: rebuild.InPlace})
		done <- err
	}()
	waitAdvisoryWaiter(t, e.store, shardKey(e.schema, "counter", projection.SharedInstance), done)
	moved := archiveTickets(t, e.store)
	release()
	err := <-done
	if moved != 50 {
		t.Fatalf("the archive in the gap moved %d events, want 50 (the request: %v)", moved, err)
	}
	if !errors.Is(err, rebuild.ErrArchived) {
		t.Fatalf("a request racing an archive of its events: %v, want ErrArchived", err)
	}
	if r, err := e.read(); err != nil || r.counted != 50 {
		t.Fatalf("the refused request changed the live model: %+v, %v", r, err)
	}
	if _, err := rebuild.Request(e.ctx, e.store, "counter", rebuild.Options{Mode: rebuild.InPlace}); !errors.Is(err, rebuild.ErrArchived) {
		t.Fatalf("a request while its events are archived: %v, want ErrArchived", err)
	}
	if _, err := e.store.Unarchive(e.ctx, postgres.ArchiveOptions{StreamType: "ticket"}); err != nil {
		t.Fatal(err)
	}
	if _, err := rebuild.Request(e.ctx, e.store, "counter", rebuild.Options{Mode: rebuild.InPlace}); err != nil {
		t.Fatalf("a request once the streams are unarchived: %v", err)
	}
}
