package projection_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(runChild())
	}
	pgtest.Main(m)
}

// env is one test's schema, store and read-model tables.
type env struct {
	t      testing.TB
	ctx    context.Context
	types  testevents.Types
	schema string
	store  *postgres.Store
}

func newEnv(t testing.TB) *env {
	t.Helper()
	types := testevents.New()
	store := pgtest.Store(t, types.Registry)
	e := &env{t: t, ctx: context.Background(), types: types, schema: store.Schema(), store: store}
	e.exec(`CREATE TABLE ` + e.table("counts") + ` (
		consumer text NOT NULL, stream_id text NOT NULL, n int NOT NULL, last_version bigint NOT NULL, bad int NOT NULL DEFAULT 0,
		PRIMARY KEY (consumer, stream_id))`)
	return e
}

func (e *env) table(name string) string { return pgx.Identifier{e.schema, name}.Sanitize() }

func (e *env) exec(sql string, args ...any) {
	e.t.Helper()
	if _, err := e.store.Pool().Exec(e.ctx, sql, args...); err != nil {
		e.t.Fatalf("%s: %v", sql, err)
	}
}

// storeOn returns a store over e's schema on another pool, as another
// process would have.
func (e *env) storeOn(pool *pgxpool.Pool) *postgres.Store {
	e.t.Helper()
	s, err := postgres.New(e.ctx, pool, postgres.Config{Schema: e.schema, Registry: e.types.Registry})
	if err != nil {
		e.t.Fatal(err)
	}
	return s
}

// countingHandler upserts a per-stream count and notes any event that does
// not follow its stream's previous one: a duplicate, a gap or a reordering.
func countingHandler(schema, consumer string) projection.HandlerFunc {
	counts := pgx.Identifier{schema, "counts"}.Sanitize()
	sql := `INSERT INTO ` + counts + ` AS c (consumer, stream_id, n, last_version, bad) VALUES ($1, $2, 1, $3::bigint, CASE WHEN $3::bigint = 1 THEN 0 ELSE 1 END)
		ON CONFLICT (consumer, stream_id) DO UPDATE SET n = c.n + 1, last_version = $3::bigint,
			bad = c.bad + CASE WHEN c.last_version = $3::bigint - 1 THEN 0 ELSE 1 END`
	return func(ctx context.Context, tx pgx.Tx, ev projector.Event) error {
		_, err := tx.Exec(ctx, sql, consumer, ev.Stream.ID, ev.Version)
		return err
	}
}

// counting returns an async projection counting every test event type.
func counting(schema string, types testevents.Types, name string, cfg projection.AsyncConfig) *projection.Async {
	return countingThrough(schema, types, name, cfg, nil)
}

// countingThrough is counting with each event passed to the counting
// handler through wrap when it is not nil (a hold a test keeps its passes
// in, passHold).
func countingThrough(schema string, types testevents.Types, name string, cfg projection.AsyncConfig,
	wrap func(projection.HandlerFunc) projection.HandlerFunc) *projection.Async {
	p := projection.NewAsync(name, cfg)
	h := countingHandler(schema, name)
	if wrap != nil {
		h = wrap(h)
	}
	must(projection.OnEvent(p, types.Opened, h))
	must(projection.OnEvent(p, types.Commented, h))
	must(projection.OnEvent(p, types.Closed, h))
	return p
}

func must(err error) {
	if err != nil {
		panic(err)
	}
}

// appendMany has writers append about total events over streams (stream
// "s-<i>" gets an opened event, then comments), concurrently, and returns the
// final version of every stream.
func (e *env) appendMany(writers, total, streams int) map[string]int64 {
	e.t.Helper()
	return appendWith(e.t, e.ctx, e.store, writers, total, streams, "s")
}

func appendWith(t testing.TB, ctx context.Context, store *postgres.Store, writers, total, streams int, prefix string) map[string]int64 {
	t.Helper()
	var mu sync.Mutex
	versions := map[string]int64{}
	var left atomic.Int64
	left.Store(int64(total))
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for left.Load() > 0 {
				// Each writer owns the streams ≡ w (mod writers): versions
				// are then known without reading them back.
				id := fmt.Sprintf("%s-%d", prefix, w+writers*rng.IntN(max(streams/writers, 1)))
				n := 1 + rng.IntN(5)
				mu.Lock()
				v := versions[id]
				mu.Unlock()
				payloads := make([]any, n)
				for i := range payloads {
					if v == 0 && i == 0 {
						payloads[i] = testevents.TicketOpened{Title: id}
					} else {
						payloads[i] = testevents.TicketCommented{Body: "c", N: i}
					}
				}
				err := pgx.BeginFunc(ctx, store.Pool(), func(tx pgx.Tx) error {
					_, err := store.Append(ctx, tx, projector.Stream("ticket", id), projector.ExactVersion(v), payloads...)
					return err
				})
				if errors.Is(err, projector.ErrConcurrency) {
					continue
				}
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				versions[id] = v + int64(n)
				mu.Unlock()
				left.Add(-int64(n))
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("append: %v", err)
	}
	return versions
}

// counts reads the counting read model of consumer.
func (e *env) counts(consumer string) (n map[string]int64, bad int) {
	e.t.Helper()
	rows, err := e.store.Pool().Query(e.ctx, `SELECT stream_id, n, bad FROM `+e.table("counts")+` WHERE consumer = $1`, consumer)
	if err != nil {
		e.t.Fatal(err)
	}
	n = map[string]int64{}
	var id string
	var c int64
	var b int
	_, err = pgx.ForEachRow(rows, []any{&id, &c, &b}, func() error {
		n[id] = c
		bad += b
		return nil
	})
	if err != nil {
		e.t.Fatal(err)
	}
	return n, bad
}

// checkCounts fails unless consumer applied every stream's events exactly
// once, in order.
func (e *env) checkCounts(consumer string, want map[string]int64) {
	e.t.Helper()
	got, bad := e.counts(consumer)
	if bad != 0 {
		e.t.Errorf("%s: %d events applied out of order or twice", consumer, bad)
	}
	if len(got) != len(want) {
		e.t.Errorf("%s: %d streams applied, want %d", consumer, len(got), len(want))
	}
	for id, v := range want {
		if got[id] != v {
			e.t.Errorf("%s: stream %s applied %d events, want %d", consumer, id, got[id], v)
		}
	}
}

func total(versions map[string]int64) int64 {
	var n int64
	for _, v := range versions {
		n += v
	}
	return n
}

// dispatcher builds and starts a dispatcher, stopped when the test ends.
func (e *env) dispatcher(cfg projection.Config) *projection.Dispatcher {
	e.t.Helper()
	if cfg.Store == nil {
		cfg.Store = e.store
	}
	if cfg.PollMax == 0 {
		cfg.PollMax = 50 * time.Millisecond
	}
	if cfg.Recheck == 0 {
		cfg.Recheck = 50 * time.Millisecond
	}
	if cfg.Logger == nil {
		cfg.Logger = testLogger(e.t)
	}
	d, err := projection.New(cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	if err := d.Start(e.ctx); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := d.Stop(ctx); err != nil {
			e.t.Errorf("stop: %v", err)
		}
	})
	return d
}

// eventually is pgtest.Eventually, short for the many waits of these
// tests: most wait for a read model to fill, polled with a query.
var eventually = pgtest.Eventually

// applied sums the counting read model of consumer, in the server: the
// crash tests poll it while children apply, and reading every stream's row
// into a map for each poll was work for nothing.
func (e *env) applied(consumer string) int64 {
	e.t.Helper()
	var n int64
	if err := e.store.Pool().QueryRow(e.ctx, `SELECT coalesce(sum(n), 0) FROM `+e.table("counts")+` WHERE consumer = $1`, consumer).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

// testLogger sends log lines to the test's log, so they show with -v or on
// failure and not otherwise.
func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
