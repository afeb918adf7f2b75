package benchmark

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/stores/postgres"
)

// Defaults of [AppendConfig].
const (
	DefaultEventsPerTx    = 1
	DefaultWriters        = 4
	DefaultAppendDuration = 3 * time.Second
)

// DefaultWriterCounts returns the writer counts a full [Run] measures each
// append size with: one writer (latency-bound, every commit its own
// flush), four, and sixteen (commits share flushes, and what each row and
// index costs shows).
func DefaultWriterCounts() []int { return []int{1, 4, 16} }

// DefaultEventsPerTxCounts returns the append sizes a full [Run] measures:
// one event per transaction (a request appending what it decided, where the
// commit and the stream head dominate) and a hundred (rows and index
// entries dominate).
func DefaultEventsPerTxCounts() []int { return []int{1, 100} }

// AppendConfig sizes [MeasureAppend]. Zero fields take the defaults.
type AppendConfig struct {
	// EventsPerTx is how many events each transaction appends; default
	// [DefaultEventsPerTx].
	EventsPerTx int
	// Writers is how many goroutines append at once, each on its own
	// connection; default [DefaultWriters].
	Writers int
	// Duration is the measuring time, both sides together; default
	// [DefaultAppendDuration].
	Duration time.Duration
}

func (c AppendConfig) withDefaults() AppendConfig {
	c.EventsPerTx = cmp.Or(c.EventsPerTx, DefaultEventsPerTx)
	c.Writers = cmp.Or(c.Writers, DefaultWriters)
	c.Duration = cmp.Or(c.Duration, DefaultAppendDuration)
	return c
}

func (c AppendConfig) validate() error {
	return errors.Join(within("events per transaction", c.EventsPerTx, 1, 10_000),
		within("writers", c.Writers, 1, 1000), notNegative("append duration", c.Duration))
}

// AppendResult is one append figure: Projector beside both baselines of
// the same run.
type AppendResult struct {
	EventsPerTx, Writers int
	// Throughput is Projector against the same-shape baseline (a table
	// LIKE projector_events INCLUDING ALL): what our code costs.
	Throughput
	// FloorEvents and FloorTime are the outbox floor's side: the cheapest
	// table that could carry the event (see [Appender.Floor]). Against it
	// the figure is what our schema and code cost together.
	FloorEvents int64
	FloorTime   time.Duration
}

// FloorRate returns the outbox floor's events per second.
func (r AppendResult) FloorRate() float64 { return rate(r.FloorEvents, r.FloorTime) }

// FloorRatio returns Projector's rate as a fraction of the outbox floor's,
// or 0 when the floor did nothing. Issue 15 wants it at 0.9 or more.
func (r AppendResult) FloorRatio() float64 {
	if r.FloorRate() == 0 {
		return 0
	}
	return r.ProjectorRate() / r.FloorRate()
}

// appendSlice is how long one side appends before the other takes over:
// short enough that drift on a shared machine hits both sides alike, long
// enough that the writers' last, unfinished transactions are a small part.
const appendSlice = 200 * time.Millisecond

// MeasureAppend measures append throughput with cfg.Writers concurrent
// writers, each transaction writing one business row and appending
// cfg.EventsPerTx events to a stream of its writer (a new stream every ten
// transactions), beside the two baselines of [Appender]: the same-shape
// raw insert and the outbox floor. The three sides take turns in slices of
// about 200ms until cfg.Duration has passed, all writers on the same side
// at once, so each slice measures real concurrent throughput and drift
// hits all three.
//
// It opens a pool of its own with one connection per writer, so the writer
// count is what PostgreSQL sees whatever the size of store's pool.
func MeasureAppend(ctx context.Context, store *postgres.Store, cfg AppendConfig) (res AppendResult, err error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return res, fmt.Errorf("measure append: %w", err)
	}
	res = AppendResult{EventsPerTx: cfg.EventsPerTx, Writers: cfg.Writers}
	a, closeWriters, err := openWriters(ctx, store, cfg)
	if err != nil {
		return res, fmt.Errorf("measure append: %w", err)
	}
	defer func() { err = errors.Join(err, closeWriters()) }()

	writers := make([]*AppendWriter, cfg.Writers)
	for i := range writers {
		writers[i] = a.Writer(i)
	}
	rounds := max(1, int(cfg.Duration/(3*appendSlice)))
	slice := cfg.Duration / time.Duration(3*rounds)
	for range rounds {
		ops, took, err := appendPhase(ctx, writers, (*AppendWriter).Raw, slice)
		if err != nil {
			return res, fmt.Errorf("measure append: raw insert: %w", err)
		}
		res.RawEvents += ops * int64(cfg.EventsPerTx)
		res.RawTime += took
		ops, took, err = appendPhase(ctx, writers, (*AppendWriter).Floor, slice)
		if err != nil {
			return res, fmt.Errorf("measure append: outbox floor: %w", err)
		}
		res.FloorEvents += ops * int64(cfg.EventsPerTx)
		res.FloorTime += took
		ops, took, err = appendPhase(ctx, writers, (*AppendWriter).Projector, slice)
		if err != nil {
			return res, fmt.Errorf("measure append: %w", err)
		}
		res.ProjectorEvents += ops * int64(cfg.EventsPerTx)
		res.ProjectorTime += took
	}
	return res, nil
}

// openWriters opens a pool of one connection per writer on store's
// database, connected before any clock starts, and an [Appender] on a
// store of that pool: the writers' side of [MeasureAppend] and
// [MeasureRowShapes]. closeWriters drops the appender's tables and closes
// the pool.
func openWriters(ctx context.Context, store *postgres.Store, cfg AppendConfig) (a *Appender, closeWriters func() error, err error) {
	pcfg := store.Pool().Config()
	pcfg.MaxConns, pcfg.MinConns = int32(cfg.Writers), 0
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, nil, fmt.Errorf("open writers' pool: %w", err)
	}
	own, err := postgres.New(ctx, pool, postgres.Config{Schema: store.Schema(), Registry: store.Registry(), Logger: quiet})
	if err == nil {
		a, err = NewAppender(ctx, own, cfg.EventsPerTx)
	}
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	closeWriters = func() error {
		defer pool.Close()
		return a.Close(ctx)
	}
	if err := warm(ctx, pool, cfg.Writers); err != nil {
		return nil, nil, errors.Join(fmt.Errorf("connect writers: %w", err), closeWriters())
	}
	return a, closeWriters, nil
}

// warm opens n connections before the clock starts, so neither side pays
// for connecting.
func warm(ctx context.Context, pool *pgxpool.Pool, n int) error {
	conns := make([]*pgxpool.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	for range n {
		c, err := pool.Acquire(ctx)
		if err != nil {
			return err
		}
		conns = append(conns, c)
	}
	return nil
}

// appendPhase runs op on every writer at once until slice has passed and
// returns the transactions committed and the time until the last ended.
// Each writer commits at least once: on a loaded machine a goroutine may
// first run after the slice has passed, and a side measured over no
// transaction at all would report a rate of zero.
func appendPhase[W any](ctx context.Context, writers []W, op func(W, context.Context) error, slice time.Duration) (int64, time.Duration, error) {
	start := time.Now()
	deadline := start.Add(slice)
	var ops atomic.Int64
	errs := make([]error, len(writers))
	var wg sync.WaitGroup
	for i, w := range writers {
		wg.Go(func() {
			for first := true; first || time.Now().Before(deadline); first = false {
				if err := op(w, ctx); err != nil {
					errs[i] = err
					return
				}
				ops.Add(1)
			}
		})
	}
	wg.Wait()
	return ops.Load(), time.Since(start), errors.Join(errs...)
}

// Appender runs single append transactions of three sides, each with the
// same business row inserted first in the same transaction (a request
// writes its own row and its events together):
//
//   - Projector: [postgres.Store.Append].
//   - Raw: one INSERT … SELECT FROM unnest of rows of the same shape into a
//     table created LIKE projector_events INCLUDING ALL (same columns,
//     defaults and indexes), its ids and JSON prepared in advance: the floor
//     of our code on our schema.
//   - Floor: the same payloads into the cheapest table that could carry
//     them as a gap-safe outbox: an identity id, the writing transaction's
//     xid8, the stream key and the payload, with one index, the primary key
//     (tx_id, id) its reader walks. The floor of the schema: what a user
//     would otherwise write by hand.
//
// [MeasureAppend] and BenchmarkAppend both drive it.
type Appender struct {
	store    *postgres.Store
	n        int
	table    string
	insert   string
	floor    string
	floorIns string
	business string
	bizIns   string
	prefix   string
	payloads []any
	types    []string
	versions []int32
	datas    []string
}

// NewAppender creates the baseline's table, named with a random suffix in
// store's schema, and the payloads of an eventsPerTx-event append. Close
// drops the table.
func NewAppender(ctx context.Context, store *postgres.Store, eventsPerTx int) (*Appender, error) {
	if eventsPerTx < 1 {
		return nil, fmt.Errorf("appender: %d events per transaction", eventsPerTx)
	}
	if err := checkRegistry(store, AppendedType, Appended{}); err != nil {
		return nil, fmt.Errorf("appender: %w", err)
	}
	suffix := randomHex(4)
	a := &Appender{store: store, n: eventsPerTx, prefix: "a" + suffix,
		table:    store.Table("bench_raw_events_" + suffix),
		floor:    store.Table("bench_raw_outbox_" + suffix),
		business: store.Table("bench_raw_business_" + suffix),
	}
	for _, ddl := range []string{
		`CREATE TABLE ` + a.table + ` (LIKE ` + store.Table("projector_events") + ` INCLUDING ALL)`,
		`CREATE TABLE ` + a.floor + ` (
			id      bigint GENERATED ALWAYS AS IDENTITY,
			tx_id   xid8   NOT NULL DEFAULT pg_current_xact_id(),
			stream  text   NOT NULL,
			payload jsonb  NOT NULL,
			PRIMARY KEY (tx_id, id))`,
		`CREATE TABLE ` + a.business + ` (id uuid PRIMARY KEY, stream text NOT NULL, title text NOT NULL)`,
	} {
		if _, err := store.Pool().Exec(ctx, ddl); err != nil {
			return nil, errors.Join(fmt.Errorf("appender: create baseline tables: %w", err), a.Close(ctx))
		}
	}
	a.floorIns = `INSERT INTO ` + a.floor + ` (stream, payload) SELECT $1, d FROM unnest($2::jsonb[]) AS d`
	a.bizIns = `INSERT INTO ` + a.business + ` (id, stream, title) VALUES ($1, $2, $3)`
	a.insert = `INSERT INTO ` + a.table + ` (id, tenant_id, stream_type, stream_id, version, type, schema_version, data, correlation_id, causation_id, actor, headers)
		SELECT ev.id, $1, $2, $3, ev.v, ev.type, ev.sv, ev.data, $8, NULL, '', NULL
		FROM unnest($4::uuid[], $5::text[], $6::int[], $7::jsonb[], $9::bigint[]) AS ev(id, type, sv, data, v)`
	const body = "the printer is on fire again"
	for j := range eventsPerTx {
		a.payloads = append(a.payloads, Appended{Body: body, N: j})
		a.types = append(a.types, AppendedType)
		a.versions = append(a.versions, 1)
		a.datas = append(a.datas, fmt.Sprintf(`{"body":%q,"n":%d}`, body, j))
	}
	return a, nil
}

// Close drops the baselines' tables, even when ctx is cancelled.
func (a *Appender) Close(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	if _, err := a.store.Pool().Exec(ctx, `DROP TABLE IF EXISTS `+a.table+`, `+a.floor+`, `+a.business); err != nil {
		return fmt.Errorf("appender: drop baseline tables: %w", err)
	}
	return nil
}

// Writer returns one writer's handle: its own streams and buffers, for one
// goroutine. Writers with different ids never share a stream.
func (a *Appender) Writer(id int) *AppendWriter {
	return &AppendWriter{a: a, id: strconv.Itoa(id), ids: make([][16]byte, a.n), vers: make([]int64, a.n)}
}

// AppendWriter appends for one goroutine; it is not safe for concurrent use.
type AppendWriter struct {
	a                         *Appender
	id                        string
	rawOps, floorOps, projOps int
	ids                       [][16]byte
	vers                      []int64
}

// businessRow inserts the transaction's own row, the same on every side.
func (w *AppendWriter) businessRow(ctx context.Context, tx pgx.Tx, stream string) error {
	_, err := tx.Exec(ctx, w.a.bizIns, [16]byte(uuid.Must(uuid.NewV7())), stream, "the printer is on fire again")
	if err != nil {
		return fmt.Errorf("business row: %w", err)
	}
	return nil
}

// stream names the stream of a writer's op-th transaction: a new stream
// every ten transactions, like requests creating aggregates and then
// working on them.
func (w *AppendWriter) stream(op int) string {
	return w.a.prefix + "-" + w.id + "-" + strconv.Itoa(op/10)
}

// Raw runs one baseline transaction.
func (w *AppendWriter) Raw(ctx context.Context) error {
	a, op := w.a, w.rawOps
	for j := range a.n {
		w.ids[j], w.vers[j] = uuid.Must(uuid.NewV7()), int64(op*a.n+j+1)
	}
	stream := w.stream(op)
	err := pgx.BeginFunc(ctx, a.store.Pool(), func(tx pgx.Tx) error {
		if err := w.businessRow(ctx, tx, stream); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, a.insert, projector.SystemTenant, "bench", stream, w.ids, a.types, a.versions, a.datas,
			[16]byte(uuid.Must(uuid.NewV7())), w.vers)
		return err
	})
	if err != nil {
		return fmt.Errorf("raw insert: %w", err)
	}
	w.rawOps++
	return nil
}

// Floor runs one outbox-floor transaction: the business row and the
// payloads into the outbox table, one statement.
func (w *AppendWriter) Floor(ctx context.Context) error {
	a := w.a
	stream := w.stream(w.floorOps)
	err := pgx.BeginFunc(ctx, a.store.Pool(), func(tx pgx.Tx) error {
		if err := w.businessRow(ctx, tx, stream); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, a.floorIns, "bench/"+stream, a.datas)
		return err
	})
	if err != nil {
		return fmt.Errorf("outbox floor insert: %w", err)
	}
	w.floorOps++
	return nil
}

// Projector runs one transaction appending through the store.
func (w *AppendWriter) Projector(ctx context.Context) error {
	a := w.a
	stream := w.stream(w.projOps)
	err := pgx.BeginFunc(ctx, a.store.Pool(), func(tx pgx.Tx) error {
		if err := w.businessRow(ctx, tx, stream); err != nil {
			return err
		}
		_, err := a.store.Append(ctx, tx, projector.Stream("bench", stream), projector.AnyVersion, a.payloads...)
		return err
	})
	if err != nil {
		return err
	}
	w.projOps++
	return nil
}

// Triple runs one transaction of each side, raw, floor, then Projector,
// and returns how long each took: the op-by-op interleaving of
// BenchmarkAppend.
func (w *AppendWriter) Triple(ctx context.Context) (raw, floor, proj time.Duration, err error) {
	start := time.Now()
	if err := w.Raw(ctx); err != nil {
		return 0, 0, 0, err
	}
	raw = time.Since(start)
	start = time.Now()
	if err := w.Floor(ctx); err != nil {
		return 0, 0, 0, err
	}
	floor = time.Since(start)
	start = time.Now()
	if err := w.Projector(ctx); err != nil {
		return 0, 0, 0, err
	}
	return raw, floor, time.Since(start), nil
}
