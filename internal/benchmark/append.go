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

// AppendResult is one append figure.
type AppendResult struct {
	EventsPerTx, Writers int
	Throughput
}

// appendSlice is how long one side appends before the other takes over:
// short enough that drift on a shared machine hits both sides alike, long
// enough that the writers' last, unfinished transactions are a small part.
const appendSlice = 200 * time.Millisecond

// MeasureAppend measures append throughput with cfg.Writers concurrent
// writers, each transaction appending cfg.EventsPerTx events to a stream
// of its writer (a new stream every ten transactions), beside the raw
// baseline of [Appender]. The sides take turns in slices of about 200ms
// until cfg.Duration has passed, all writers on the same side at once, so
// each slice measures real concurrent throughput and drift hits both.
//
// It opens a pool of its own with one connection per writer, so the writer
// count is what PostgreSQL sees whatever the size of store's pool.
func MeasureAppend(ctx context.Context, store *postgres.Store, cfg AppendConfig) (res AppendResult, err error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return res, fmt.Errorf("measure append: %w", err)
	}
	res = AppendResult{EventsPerTx: cfg.EventsPerTx, Writers: cfg.Writers}
	pcfg := store.Pool().Config()
	pcfg.MaxConns, pcfg.MinConns = int32(cfg.Writers), 0
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return res, fmt.Errorf("measure append: open writers' pool: %w", err)
	}
	defer pool.Close()
	own, err := postgres.New(ctx, pool, postgres.Config{Schema: store.Schema(), Registry: store.Registry(), Logger: quiet})
	if err != nil {
		return res, fmt.Errorf("measure append: %w", err)
	}
	a, err := NewAppender(ctx, own, cfg.EventsPerTx)
	if err != nil {
		return res, fmt.Errorf("measure append: %w", err)
	}
	defer func() { err = errors.Join(err, a.Close(ctx)) }()
	if err := warm(ctx, pool, cfg.Writers); err != nil {
		return res, fmt.Errorf("measure append: connect writers: %w", err)
	}

	writers := make([]*AppendWriter, cfg.Writers)
	for i := range writers {
		writers[i] = a.Writer(i)
	}
	rounds := max(1, int(cfg.Duration/(2*appendSlice)))
	slice := cfg.Duration / time.Duration(2*rounds)
	for range rounds {
		ops, took, err := appendPhase(ctx, writers, (*AppendWriter).Raw, slice)
		if err != nil {
			return res, fmt.Errorf("measure append: raw insert: %w", err)
		}
		res.RawEvents += ops * int64(cfg.EventsPerTx)
		res.RawTime += took
		ops, took, err = appendPhase(ctx, writers, (*AppendWriter).Projector, slice)
		if err != nil {
			return res, fmt.Errorf("measure append: %w", err)
		}
		res.ProjectorEvents += ops * int64(cfg.EventsPerTx)
		res.ProjectorTime += took
	}
	return res, nil
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
func appendPhase(ctx context.Context, writers []*AppendWriter, op func(*AppendWriter, context.Context) error, slice time.Duration) (int64, time.Duration, error) {
	start := time.Now()
	deadline := start.Add(slice)
	var ops atomic.Int64
	errs := make([]error, len(writers))
	var wg sync.WaitGroup
	for i, w := range writers {
		wg.Go(func() {
			for time.Now().Before(deadline) {
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

// Appender runs single append transactions of both sides:
// [postgres.Store.Append] and its raw baseline, one INSERT … SELECT FROM unnest of rows of the same
// shape into a table created LIKE projector_events INCLUDING ALL (same
// columns, defaults and indexes), its ids and JSON prepared in advance: the
// floor. [MeasureAppend] and BenchmarkAppend both drive it.
type Appender struct {
	store    *postgres.Store
	n        int
	table    string
	insert   string
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
	a := &Appender{store: store, n: eventsPerTx, table: store.Table("bench_raw_events_" + suffix), prefix: "a" + suffix}
	if _, err := store.Pool().Exec(ctx, `CREATE TABLE `+a.table+` (LIKE `+store.Table("projector_events")+` INCLUDING ALL)`); err != nil {
		return nil, fmt.Errorf("appender: create baseline table: %w", err)
	}
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

// Close drops the baseline's table, even when ctx is cancelled.
func (a *Appender) Close(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	if _, err := a.store.Pool().Exec(ctx, `DROP TABLE IF EXISTS `+a.table); err != nil {
		return fmt.Errorf("appender: drop baseline table: %w", err)
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
	a               *Appender
	id              string
	rawOps, projOps int
	ids             [][16]byte
	vers            []int64
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
	err := pgx.BeginFunc(ctx, a.store.Pool(), func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, a.insert, projector.SystemTenant, "bench", w.stream(op), w.ids, a.types, a.versions, a.datas,
			[16]byte(uuid.Must(uuid.NewV7())), w.vers)
		return err
	})
	if err != nil {
		return fmt.Errorf("raw insert: %w", err)
	}
	w.rawOps++
	return nil
}

// Projector runs one transaction appending through the store.
func (w *AppendWriter) Projector(ctx context.Context) error {
	a, op := w.a, w.projOps
	err := pgx.BeginFunc(ctx, a.store.Pool(), func(tx pgx.Tx) error {
		_, err := a.store.Append(ctx, tx, projector.Stream("bench", w.stream(op)), projector.AnyVersion, a.payloads...)
		return err
	})
	if err != nil {
		return err
	}
	w.projOps++
	return nil
}

// Pair runs one baseline transaction and then one Projector transaction
// and returns how long each took: the op-by-op interleaving of
// BenchmarkAppend.
func (w *AppendWriter) Pair(ctx context.Context) (raw, proj time.Duration, err error) {
	start := time.Now()
	if err := w.Raw(ctx); err != nil {
		return 0, 0, err
	}
	raw = time.Since(start)
	start = time.Now()
	if err := w.Projector(ctx); err != nil {
		return 0, 0, err
	}
	return raw, time.Since(start), nil
}
