package live_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/live"
	"github.com/projectorhq/projector/stores/postgres"
)

// TestPromise15_ResumeWithoutGapsUnderConcurrentWriters: a client that
// keeps disconnecting and reconnecting with its Last-Event-ID, alternately
// to two processes' feeds, while four writers append to its tenant and
// another, some transactions committing long after younger ones and some
// rolling back, ends with exactly the committed events of its tenant, in
// log order: none missed at a hand-over, none twice.
func TestPromise15_ResumeWithoutGapsUnderConcurrentWriters(t *testing.T) {
	t.Parallel()
	// Small catch-up reads: a reconnect takes several of them.
	cfg := live.Config{CatchUpBatch: 7}
	e := newEnv(t, cfg, false)
	_, other := e.serve(cfg, false)
	bases := []string{e.srv.URL, other.URL}

	conn := e.connect("a", "", "")
	pgtest.Eventually(t, wait, "a live client", func() bool { return e.feed.Clients() == 1 })

	var commits atomic.Int64
	ctx, stop := context.WithCancel(e.ctx)
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 15))
			for i := 0; ctx.Err() == nil && i < 150; i++ {
				tenant := []string{"a", "b"}[rng.IntN(2)]
				ref := projector.TenantStream(tenant, "ticket", fmt.Sprintf("w%d-%d", w, rng.IntN(5)))
				if i%17 == 3 {
					if err := pgx.BeginFunc(ctx, e.store.Pool(), func(tx pgx.Tx) error {
						if _, err := e.store.Append(ctx, tx, ref, projector.AnyVersion, testevents.TicketCommented{Body: "rolled back"}); err != nil {
							return err
						}
						return errRollback
					}); err != errRollback {
						t.Error(err)
					}
					continue
				}
				e.appendTo(ref, testevents.TicketCommented{Body: "x", N: i}, testevents.TicketCommented{Body: "y", N: i})
				commits.Add(1)
			}
		})
	}
	// One holder at a time: its transaction takes its id first and commits
	// after 30 younger ones did (or after a second, should the writers be
	// done), so the log commits out of order.
	holderDone := make(chan struct{})
	go func() {
		defer close(holderDone)
		for i := 0; ctx.Err() == nil && i < 12; i++ {
			e.appendHeld(ctx, projector.TenantStream("a", "ticket", fmt.Sprintf("held-%d", i)), &commits, 30)
		}
	}()
	writersDone := make(chan struct{})
	go func() { wg.Wait(); <-holderDone; close(writersDone) }()
	defer func() { stop(); <-writersDone }()

	rng := rand.New(rand.NewPCG(15, 15))
	var got []string
	last := ""
	reconnects := 0
	// take reads up to n events; false when the stream ended or stayed
	// idle for idle.
	take := func(s *sse, n int, idle time.Duration) bool {
		timer := time.NewTimer(idle)
		defer timer.Stop()
		for k := 0; k < n; {
			select {
			case m, ok := <-s.msgs:
				if !ok {
					return false
				}
				if m.comment != "" {
					continue // heartbeats do not count as progress
				}
				if m.id == "" {
					t.Fatalf("control message %+v", m)
				}
				got = append(got, m.id)
				last = m.id
				k++
				timer.Reset(idle)
			case <-timer.C:
				return false
			}
		}
		return true
	}
	for running := true; running; {
		select {
		case <-writersDone:
			running = false
		default:
		}
		take(conn, 1+rng.IntN(40), 50*time.Millisecond)
		if last == "" {
			// Nothing yet (another session may hold the horizon): a
			// reconnect without an id would start from now.
			continue
		}
		conn.close()
		reconnects++
		conn = e.connectTo(bases[reconnects%2], "a", "", last)
		if conn.status != 200 {
			t.Fatalf("reconnect: %d %s", conn.status, conn.body)
		}
	}
	if t.Failed() {
		return
	}
	// The schema is fresh and the client was live before the first append:
	// it must get every event of its tenant.
	want := e.logIDs("a", nil, projector.Start)
	// Read until there is as much as expected or nothing more comes, and
	// compare: a gap shows as a missing id, a duplicate as an extra one.
	for len(got) < len(want) && take(conn, 1, wait) {
	}
	sameIDs(t, fmt.Sprintf("after %d reconnects", reconnects), got, want)
	if len(want) < 200 {
		t.Fatalf("only %d events for tenant a: the test did not test much", len(want))
	}
}

var errRollback = fmt.Errorf("roll back")

// appendHeld appends one event to ref in a transaction that commits only
// after n more commits were counted, so it commits out of order.
func (e *env) appendHeld(ctx context.Context, ref projector.StreamRef, commits *atomic.Int64, n int64) {
	e.t.Helper()
	tx, err := e.store.Pool().Begin(ctx)
	if err != nil {
		e.t.Error(err)
		return
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	res, err := e.store.Append(ctx, tx, ref, projector.AnyVersion, testevents.TicketOpened{Title: "held"})
	if err != nil {
		e.t.Error(err)
		return
	}
	from := commits.Load()
	deadline := time.Now().Add(time.Second)
	for commits.Load() < from+n && ctx.Err() == nil && time.Now().Before(deadline) {
		// The other writers commit meanwhile; poll the counter.
		time.Sleep(time.Millisecond)
	}
	if err := tx.Commit(ctx); err != nil {
		e.t.Error(err)
		return
	}
	e.appended(res.Events[0].Position)
	commits.Add(1)
}

// TestPromise15_PrunedHistoryIsReset: a Last-Event-ID whose event retention
// deleted, or after which retention deleted events of the client's types,
// is never resumed as if nothing were missing: the stream starts with
// `event: reset`, then goes live.
func TestPromise15_PrunedHistoryIsReset(t *testing.T) {
	t.Parallel()
	e := newEnvStore(t, live.Config{}, false, postgres.Config{Ephemeral: []string{"note"}})
	c := e.connect("a", "", "")
	pgtest.Eventually(t, wait, "a live client", func() bool { return e.feed.Clients() == 1 })
	e.appendTo(projector.TenantStream("a", "ticket", "kept"), testevents.TicketOpened{Title: "kept"})
	e.appendTo(projector.TenantStream("a", "note", "n1"), testevents.TicketCommented{Body: "1"}, testevents.TicketCommented{Body: "2"})
	e.appendTo(projector.TenantStream("a", "ticket", "kept"), testevents.TicketClosed{})
	got := ids(c.collect(t, 4, wait))
	c.close()
	// Nothing pruned yet: resuming after the first event gets the rest.
	resumed := e.connect("a", "", got[0])
	sameIDs(t, "before the prune", ids(resumed.collect(t, 3, wait)), got[1:])
	resumed.close()

	// The live consumer has passed the notes, so retention may delete them.
	pgtest.Eventually(t, wait, "the prune to delete the notes", func() bool {
		res, err := e.store.Prune(e.ctx, postgres.PruneOptions{OlderThan: time.Microsecond})
		if err != nil {
			t.Fatal(err)
		}
		return res.Deleted == 2
	})
	for _, c := range []struct{ name, id string }{
		{"the kept event before the pruned ones", got[0]},
		{"a pruned event", got[1]},
	} {
		s := e.connect("a", "", c.id)
		m, ok := s.next(t, wait)
		if !ok || m.event != "reset" || !strings.Contains(m.data, "retention") || !strings.Contains(m.data, c.id) {
			t.Fatalf("resuming after %s: %+v, want a reset naming retention", c.name, m)
		}
		pgtest.Eventually(t, wait, "the reset client to go live", func() bool { return e.feed.Clients() == 1 })
		e.append("a", "after", testevents.TicketCommented{Body: "live"})
		if m := s.collect(t, 1, wait)[0]; m.event != "ticket.commented" {
			t.Fatalf("after the reset: %+v", m)
		}
		s.close()
	}
	// A client filtered to a type retention did not touch resumes exactly.
	s := e.connect("a", query("types", "ticket.closed"), got[0])
	sameIDs(t, "types untouched by the prune", ids(s.collect(t, 1, wait)), got[3:])
}

// TestPromise15_ResumeReadsTheArchive: a client resumes from an event whose
// stream was archived since, with more archived events after it: it gets
// them from the archive, then the hot log's, in log order, each once.
func TestPromise15_ResumeReadsTheArchive(t *testing.T) {
	t.Parallel()
	e := newEnv(t, live.Config{CatchUpBatch: 2}, false)
	c := e.connect("a", "", "")
	pgtest.Eventually(t, wait, "a live client", func() bool { return e.feed.Clients() == 1 })
	old := projector.TenantStream("a", "ticket", "old")
	e.appendTo(old, testevents.TicketOpened{Title: "old"})
	e.appendTo(projector.TenantStream("a", "ticket", "hot"), testevents.TicketOpened{Title: "hot"})
	e.appendTo(old, testevents.TicketCommented{Body: "1"}, testevents.TicketCommented{Body: "2"})
	e.appendTo(old, testevents.TicketClosed{})
	got := ids(c.collect(t, 5, wait))
	c.close()

	// The live consumer has passed the old stream, so it may be archived.
	pgtest.Eventually(t, wait, "the old stream to be archived", func() bool {
		res, err := e.store.Archive(e.ctx, postgres.ArchiveOptions{Streams: []projector.StreamRef{old}})
		if err != nil {
			t.Fatal(err)
		}
		return res.Streams == 1
	})
	e.append("a", "later", testevents.TicketCommented{Body: "after the archive"})
	hot := e.logIDs("a", nil, projector.Position{}) // the hot log: "hot" and "later"
	want := append(got[1:len(got):len(got)], hot[len(hot)-1])
	s := e.connect("a", "", got[0])
	sameIDs(t, "resuming after an archived event", ids(s.collect(t, len(want), wait)), want)
	s.close()
}

// An event fanned out while a client joins, after its catch-up read and
// before the fan-out has it, still reaches it, with no later event to
// bring it: before, it waited for the fan-out's next batch, which a quiet
// stream may never have (a browser reconnecting every 200 ms missed the
// last event of its writer in 3 runs of 11).
func TestPromise15_EventFannedOutWhileJoiningIsSent(t *testing.T) {
	t.Parallel()
	e := newEnv(t, live.Config{}, false)
	var once sync.Once
	live.SetJoining(e.feed, func() {
		once.Do(func() {
			var at projector.Position
			if err := pgx.BeginFunc(e.ctx, e.store.Pool(), func(tx pgx.Tx) error {
				res, err := e.store.Append(e.ctx, tx, projector.TenantStream("a", "ticket", "gap"), projector.AnyVersion, testevents.TicketOpened{Title: "gap"})
				if err == nil {
					at = res.Events[0].Position
				}
				return err
			}); err != nil {
				t.Error(err)
				return
			}
			for deadline := time.Now().Add(wait); ; time.Sleep(time.Millisecond) { // polling interval, not synchronisation
				if last, ok := e.feed.FannedOut(); ok && !last.Less(at) {
					return // fanned out before the client joined
				}
				if time.Now().After(deadline) {
					t.Error("the event appended while the client joined was not fanned out")
					return
				}
			}
		})
	})
	c := e.connect("a", "", "")
	if m := c.collect(t, 1, wait)[0]; m.event != "ticket.opened" {
		t.Fatalf("got %s, want the ticket.opened fanned out while the client joined", m.event)
	}
}
