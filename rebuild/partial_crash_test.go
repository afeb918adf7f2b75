package rebuild_test

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/rebuild"
	"github.com/projectorhq/projector/stores/postgres"
)

// A partial child is this test binary run as a process that partially
// rebuilds tenant "big" of the tickets projection once, so a test can
// SIGKILL it mid-replay. Its connections carry an application_name of their
// own, so the test can see when its transaction has written.
const (
	partialChildEnv    = "PROJECTOR_TEST_PARTIAL_CHILD" // the application_name
	partialChildURLEnv = "PROJECTOR_TEST_PARTIAL_URL"
	partialChildSchema = "PROJECTOR_TEST_PARTIAL_SCHEMA"
)

func runPartialChild() int {
	ctx := context.Background()
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	cfg, err := pgxpool.ParseConfig(os.Getenv(partialChildURLEnv))
	if err != nil {
		logger.Error("partial child: pool", "error", err)
		return 1
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = os.Getenv(partialChildEnv)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		logger.Error("partial child: pool", "error", err)
		return 1
	}
	defer pool.Close()
	types := testevents.New()
	schema := os.Getenv(partialChildSchema)
	store, err := postgres.New(ctx, pool, postgres.Config{Schema: schema, Registry: types.Registry, Logger: logger})
	if err != nil {
		logger.Error("partial child: store", "error", err)
		return 1
	}
	e := &penv{types: types, schema: schema, mails: map[string]map[string]int{}}
	p := e.ticketsWith("tickets", "tickets", projection.AsyncConfig{BatchSize: 1000})
	if _, err := rebuild.Partial(ctx, store, p, projection.TenantScope("big"), rebuild.PartialOptions{BatchSize: 100, Logger: logger}); err != nil {
		logger.Error("partial child: rebuild", "error", err)
		return 1
	}
	return 0
}

// A process running a partial rebuild is SIGKILLed at random moments after
// its transaction has written, three times, in a tenant of 2,000 events
// (10,000 in a soak run, see pgtest.EnvSoak: the replay takes seconds under
// the race detector either way, far longer than the kill's random delay of
// at most 300 ms): each time nothing of it is left
// (the corrupted rows are byte-equal to before), the live consumer goes on
// (its lock went with the killed backend), and a partial rebuild run after
// the kills is exact.
func TestPartialRebuildSIGKILL(t *testing.T) {
	t.Parallel()
	e := newPartialEnv(t)
	var payloads []any
	for range 49 {
		payloads = append(payloads, testevents.TicketCommented{Body: "x"})
	}
	streams := pgtest.Size(40, 200) // of 50 events each
	err := pgx.BeginFunc(e.ctx, e.store.Pool(), func(tx pgx.Tx) error {
		for i := range streams {
			if _, err := e.store.Append(e.ctx, tx, projector.TenantStream("big", "ticket", fmt.Sprint(i)), projector.NoStream,
				append([]any{testevents.TicketOpened{Title: "t"}}, payloads...)...); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	cfg := projection.AsyncConfig{BatchSize: 1000}
	d := e.dispatcher(e.ticketsWith("tickets", "tickets", cfg), e.ticketsWith("tickets_ref", "tickets_ref", cfg))
	ctx, cancel := context.WithTimeout(e.ctx, 2*time.Minute)
	defer cancel()
	if err := d.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	app := "partial-child-" + e.schema
	backends := func(withXID bool) int {
		q := `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`
		if withXID {
			q += ` AND backend_xid IS NOT NULL`
		}
		return e.count(q, app)
	}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 9))
	kills := 0
	attempt := 0
	for ; kills < 3; attempt++ {
		if attempt > 20 {
			t.Fatalf("only %d of 20 children were killed mid-rebuild; the rest finished first", kills)
		}
		e.exec(`UPDATE ` + e.ident("tickets") + ` SET n = 0, title = 'corrupt' WHERE tenant_id = 'big'`)
		before := e.rows("tickets", "true")
		child := pgtest.StartChild(t, partialChildEnv+"="+app, partialChildURLEnv+"="+pgtest.URL(t), partialChildSchema+"="+e.schema)
		wrote := false
		for deadline := time.Now().Add(time.Minute); !wrote && time.Now().Before(deadline); {
			select {
			case <-child.Done():
				t.Fatalf("the child ended before its transaction wrote:\n%s", child.Output())
			case <-time.After(10 * time.Millisecond): // poll the child's backend (it takes far longer to start)
			}
			wrote = backends(true) > 0
		}
		if !wrote {
			t.Fatal("the child's transaction never wrote")
		}
		select {
		case <-time.After(time.Duration(rng.IntN(300)) * time.Millisecond): // a random moment to crash at
		case <-child.Done():
			if !child.Succeeded() {
				t.Fatalf("child failed:\n%s", child.Output())
			}
			continue // it finished first: try again
		}
		child.Kill(t)
		if !child.Killed() {
			continue // it committed just before the kill
		}
		eventually(t, time.Minute, "the killed child's backend to end", func() bool { return backends(false) == 0 })
		if after := e.rows("tickets", "true"); strings.Join(after, "\n") != strings.Join(before, "\n") {
			// Killed between its COMMIT and its exit: the rebuild is
			// whole (the tenant's rows are the reference's), not half
			// written, and this was no kill mid-rebuild.
			if len(e.diff("tickets", "tickets_ref", "tenant_id = 'big'")) == 0 {
				continue
			}
			t.Fatalf("kill %d: a killed partial rebuild left changes behind", kills+1)
		}
		kills++
		// The live consumer is not stuck behind the dead rebuild's lock.
		if err := e.ticket(projector.TenantStream("other", "ticket", fmt.Sprint(kills))); err != nil {
			t.Fatal(err)
		}
		if err := d.CatchUp(ctx); err != nil {
			t.Fatalf("kill %d: the live consumer did not catch up: %v", kills, err)
		}
	}
	t.Logf("killed %d partial rebuilds mid-replay in %d attempts", kills, attempt)
	res, err := rebuild.Partial(e.ctx, e.store, e.ticketsWith("tickets", "tickets", cfg), projection.TenantScope("big"), rebuild.PartialOptions{})
	if err != nil || res.Events != streams*50 {
		t.Fatalf("%+v, %v", res, err)
	}
	if diff := e.diff("tickets", "tickets_ref", "true"); len(diff) > 0 {
		t.Fatalf("after %d kills and a partial rebuild, the model differs from the one built live:\n%s", kills, strings.Join(diff, "\n"))
	}
}
