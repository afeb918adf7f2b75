package search_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/search"
	"github.com/projectorhq/projector/stores/meilisearch"
	"github.com/projectorhq/projector/stores/meilisearch/meilisearchtest"
)

// quickRetries retries a failing batch within milliseconds, so outage
// tests do not wait for production backoffs.
var quickRetries = projection.AsyncConfig{RetryBackoff: 5 * time.Millisecond, MaxBackoff: 100 * time.Millisecond, MaxAttempts: 100_000}

// TestMeiliFailedTask: Meilisearch accepts a batch (202) and its task
// fails. In halt mode the shard halts with the task's error code in its
// status, the events before the failing one indexed and nothing after it;
// in continuous mode that event is dead-lettered and the rest indexed.
func TestMeiliFailedTask(t *testing.T) {
	for _, mode := range []projection.ErrorMode{projection.HaltOnError, projection.SkipApplyErrors} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			fake := meilisearchtest.New(t)
			b := meiliBackend(e, fake.URL(), "")
			fake.FailDocuments(func(doc map[string]json.RawMessage) bool { return string(doc["title"]) == `"poison"` }, "invalid_document_fields")
			p := e.ticketProjection("ticket_search", b, projection.AsyncConfig{ErrorMode: mode, MaxAttempts: 2, RetryBackoff: 5 * time.Millisecond})
			e.append("acme", "T-1", testevents.TicketOpened{Title: "before"})
			e.append("acme", "T-2", testevents.TicketOpened{Title: "poison"})
			e.append("acme", "T-3", testevents.TicketOpened{Title: "after"})
			d := e.dispatcher(p)
			if mode == projection.HaltOnError {
				admin := projection.NewAdmin(e.store)
				var st projection.ShardState
				eventually(t, 30*time.Second, "the shard to halt", func() bool {
					var err error
					st, err = admin.Status(e.ctx, projection.ShardID{Consumer: "ticket_search", Instance: projection.SharedInstance})
					must(t, err)
					return st.Status == projection.StatusDead
				})
				if !strings.Contains(st.LastError, "task failed") || !strings.Contains(st.LastError, "invalid_document_fields") {
					t.Fatalf("dead shard's last error %q does not carry the task's error", st.LastError)
				}
				sameIndex(t, "after the halt", []string{`acme/T-1 {"id":"T-1","status":"open","title":"before"}`}, indexed(t, e.ctx, b))
				return
			}
			e.catchUp(d)
			var n int
			must(t, e.store.Pool().QueryRow(e.ctx, `SELECT count(*) FROM `+e.store.Table("projector_dead_letters")+
				` WHERE consumer = 'ticket_search' AND event_type = 'ticket.opened'`).Scan(&n))
			if n != 1 {
				t.Fatalf("%d dead letters, want 1 (the poison document's event)", n)
			}
			sameIndex(t, "continuous mode", []string{
				`acme/T-1 {"id":"T-1","status":"open","title":"before"}`,
				`acme/T-3 {"id":"T-3","status":"open","title":"after"}`,
			}, indexed(t, e.ctx, b))
		})
	}
}

// countingBackend counts the backend's Apply calls: one per tenant of a
// dispatcher batch.
type countingBackend struct {
	search.Backend
	calls atomic.Int64
}

func (c *countingBackend) Apply(ctx context.Context, tx pgx.Tx, idx search.Index, ops []search.Op) error {
	c.calls.Add(1)
	return c.Backend.Apply(ctx, tx, idx, ops)
}

func (c *countingBackend) Documents(ctx context.Context, idx search.Index) ([]search.Stored, error) {
	return c.Backend.(search.Lister).Documents(ctx, idx)
}

// TestMeiliBatchesRequests: 300 events that open, comment on and delete
// 100 tickets, interleaved, go out as at most one request per kind of
// operation (upsert, patch, delete) and dispatcher batch, not one per
// event. (How many batches the dispatcher makes depends on the cluster's
// horizon, which other sessions' transactions move, so the bound is per
// batch.)
func TestMeiliBatchesRequests(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	fake := meilisearchtest.New(t)
	b := &countingBackend{Backend: meiliBackend(e, fake.URL(), "")}
	p := e.ticketProjection("ticket_search", b, projection.AsyncConfig{BatchSize: 1000})
	m := model{}
	for i := range 100 {
		id := fmt.Sprintf("T-%d", i)
		payloads := []any{testevents.TicketOpened{Title: "printer " + id}, testevents.TicketCommented{Body: "jammed", N: i}}
		if i%10 == 0 {
			payloads = append(payloads, testevents.TicketClosed{Reason: "delete"})
		} else {
			payloads = append(payloads, testevents.TicketCommented{Body: "still", N: i + 1})
		}
		e.append("acme", id, payloads...)
		for _, pl := range payloads {
			m.apply("acme", id, pl)
		}
	}
	e.catchUp(e.dispatcher(p))
	sameIndex(t, "after the batch", m.canonical(t), indexed(t, e.ctx, b))
	calls := int(b.calls.Load())
	if calls > 20 {
		t.Fatalf("%d Apply calls for 300 events in batches of 1000", calls)
	}
	for _, kind := range []string{"POST /indexes/{uid}/documents", "PUT /indexes/{uid}/documents", "POST /indexes/{uid}/documents/delete-batch"} {
		if got := fake.Requests(kind); got > calls {
			t.Errorf("%s: %d requests for %d batches; want at most one a batch", kind, got, calls)
		}
	}
	if got := fake.Requests("POST /indexes/{uid}/documents"); got < 1 {
		t.Errorf("no document request at all")
	}
}

// TestMeiliEnsureUnreachable: a server that cannot be reached at start is
// a clear start-up error, not a halted shard later.
func TestMeiliEnsureUnreachable(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	fake := meilisearchtest.New(t)
	fake.Down()
	b := meiliBackend(e, fake.URL(), "")
	p := search.New("ticket_search", search.Config{Index: ticketIndex, Backend: b})
	err := p.Ensure(e.ctx)
	if !errors.Is(err, meilisearch.ErrUnavailable) || !strings.Contains(err.Error(), "ticket_search") {
		t.Fatalf("Ensure against a closed port: %v; want ErrUnavailable naming the projection", err)
	}
}

// TestPromise13_MeiliOutageLosesNothing: Meilisearch answers 503 for a
// while, then refuses connections, then comes back. Appends go on all the
// while; the shard shows the failure in its status and retries with
// backoff; afterwards the index holds exactly what the log says.
func TestPromise13_MeiliOutageLosesNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	fake := meilisearchtest.New(t)
	b := meiliBackend(e, fake.URL(), "")
	p := e.ticketProjection("ticket_search", b, quickRetries)
	d := e.dispatcher(p)
	admin := projection.NewAdmin(e.store)
	id := projection.ShardID{Consumer: "ticket_search", Instance: projection.SharedInstance}
	rng := rand.New(rand.NewPCG(1303, uint64(time.Now().UnixNano())))
	tenants := []string{"acme", "globex"}
	m := e.history(rng, model{}, tenants, 40, 200)
	e.catchUp(d)
	sameIndex(t, "before the outage", m.canonical(t), indexed(t, e.ctx, b))

	failingWith := func(what string) {
		t.Helper()
		eventually(t, 30*time.Second, "the shard to report "+what, func() bool {
			st, err := admin.Status(e.ctx, id)
			must(t, err)
			return st.Attempts > 0 && strings.Contains(st.LastError, what)
		})
	}
	fake.Unavailable(true)
	e.history(rng, m, tenants, 40, 150) // appends do not wait for Meilisearch
	failingWith("503")
	fake.Down()
	e.history(rng, m, tenants, 40, 150)
	failingWith("refused")
	fake.Unavailable(false)
	fake.Up(t)
	e.catchUp(d)
	sameIndex(t, "after the outage", m.canonical(t), indexed(t, e.ctx, b))
	st, err := admin.Status(e.ctx, id)
	must(t, err)
	if st.Status == projection.StatusDead || st.Attempts != 0 {
		t.Fatalf("shard after recovery: %+v", st)
	}
}
