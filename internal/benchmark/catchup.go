package benchmark

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"runtime"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/trace"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

// Defaults of [CatchUpConfig].
const (
	DefaultBacklog = 50_000
	DefaultStreams = 1000
)

// CatchUpConfig sizes a catch-up measurement. Zero fields take the
// defaults.
type CatchUpConfig struct {
	// Events is the backlog to catch up; default [DefaultBacklog].
	Events int
	// Streams is how many streams the backlog is spread over, each getting
	// one row in the read model; default [DefaultStreams].
	Streams int
	// BatchSize is the events per transaction on both sides; default
	// [projection.DefaultBatchSize].
	BatchSize int
	// TracerProvider is the dispatcher's (nil: the global one), to measure
	// what tracing costs a catch-up.
	TracerProvider trace.TracerProvider
}

func (c CatchUpConfig) withDefaults() CatchUpConfig {
	c.Events = cmp.Or(c.Events, DefaultBacklog)
	c.Streams = cmp.Or(c.Streams, DefaultStreams)
	c.BatchSize = cmp.Or(c.BatchSize, projection.DefaultBatchSize)
	return c
}

func (c CatchUpConfig) validate() error {
	return errors.Join(within("backlog events", c.Events, 1, math.MaxInt32),
		within("streams", c.Streams, 1, math.MaxInt32), within("batch size", c.BatchSize, 1, 100_000))
}

// Form is the shape of the handlers being measured.
type Form string

const (
	// PerEvent: one handler call and one upsert per event, against a loop
	// issuing the same per-event statements.
	PerEvent Form = "per-event"
	// Pipelined: per-event handlers that queue their upsert with
	// [projection.Queue], against a loop sending the same per-event
	// statements in one pgx.Batch per batch.
	Pipelined Form = "per-event-pipelined"
	// Batched: one OnBatch handler per batch writing one unnest upsert,
	// against a set-based loop doing the same.
	Batched Form = "batch"
	// BatchedRawPayloads is Batched with [projection.AsyncConfig]
	// RawPayloads: the handler only needs stream ids, so the dispatcher
	// skips decoding payloads, as a projection writing JSON straight to SQL
	// would.
	BatchedRawPayloads Form = "batch-raw-payloads"
)

// Forms returns every form, in the order they are reported.
func Forms() []Form { return []Form{PerEvent, Pipelined, Batched, BatchedRawPayloads} }

// CatchUpResult is one catch-up figure.
type CatchUpResult struct {
	Form      Form
	Events    int // the backlog; each side applies all of it once per round
	BatchSize int
	// Throughput is Projector beside the one-column raw loop, the floor:
	// it reads only the stream id the upsert needs and decodes nothing.
	Throughput
	// Decoding is Projector beside the second, fairer baseline: the same
	// raw loop reading the columns a typical handler uses (id, position,
	// tenant, stream, version, type, schema version, payload, recorded
	// time) and decoding each payload into the same Go type the
	// dispatcher hands the handler, with encoding/json. For
	// [BatchedRawPayloads] it reads the same columns but, like that form,
	// leaves the payload undecoded. Its Projector side is the same run as
	// Throughput's.
	Decoding Throughput
	// PeakHeap is the most Go heap in use while the dispatcher ran, in
	// bytes: the dispatcher streams batches, so it must not grow with the
	// backlog.
	PeakHeap uint64
}

// MeasureCatchUp fills store with a backlog of cfg.Events events and
// measures catching it up once per [Form]: the raw loop, then the
// dispatcher. See [CatchUp].
func MeasureCatchUp(ctx context.Context, store *postgres.Store, cfg CatchUpConfig) (res []CatchUpResult, err error) {
	c, err := NewCatchUp(ctx, store, cfg)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, c.Close(ctx)) }()
	for _, form := range Forms() {
		r, err := c.Measure(ctx, form)
		if err != nil {
			return nil, err
		}
		res = append(res, r)
	}
	return res, nil
}

// catchUpConsumer is the dispatcher's consumer name; its state row is
// reset before every run.
const catchUpConsumer = "bench-catch-up"

// CatchUp is a backlog and the read model that counts it: a counting
// projection upserting one row per stream, applied either by a dispatcher
// or by the raw loop, what a careful engineer would write by hand without
// Projector: one transaction per batch that locks a cursor row (FOR UPDATE
// SKIP LOCKED), reads the batch in (tx_id, seq) order below the horizon,
// upserts and moves the cursor. [MeasureCatchUp] and BenchmarkCatchUp both
// drive it.
type CatchUp struct {
	store                                                     *postgres.Store
	cfg                                                       CatchUpConfig
	counts, cursor                                            string
	upsert, setUpsert, read, readFull, lockCursor, moveCursor string
}

// NewCatchUp creates the read-model and cursor tables in store's schema
// and inserts the backlog straight in SQL (the append path has its own
// measurement). The schema's log must not hold a backlog already: use a
// fresh schema. Close drops the tables; the backlog stays in the log.
func NewCatchUp(ctx context.Context, store *postgres.Store, cfg CatchUpConfig) (*CatchUp, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("catch-up: %w", err)
	}
	if err := checkRegistry(store, BackloggedType, Backlogged{}); err != nil {
		return nil, fmt.Errorf("catch-up: %w", err)
	}
	events := store.Table("projector_events")
	c := &CatchUp{store: store, cfg: cfg, counts: store.Table("bench_counts"), cursor: store.Table("bench_cursor")}
	c.upsert = `INSERT INTO ` + c.counts + ` AS c (stream_id, n) VALUES ($1, 1) ON CONFLICT (stream_id) DO UPDATE SET n = c.n + 1`
	c.setUpsert = `INSERT INTO ` + c.counts + ` AS c (stream_id, n) SELECT * FROM unnest($1::text[], $2::bigint[])
		ON CONFLICT (stream_id) DO UPDATE SET n = c.n + excluded.n`
	c.read = `SELECT e.tx_id, e.seq, e.stream_id FROM ` + events + ` e
		WHERE (e.tx_id, e.seq) > ($1::xid8, $2::bigint) AND e.tx_id < pg_snapshot_xmin(pg_current_snapshot())
		  AND e.type = ANY($3::text[])
		ORDER BY e.tx_id, e.seq LIMIT $4`
	c.readFull = `SELECT e.tx_id, e.seq, e.id, e.tenant_id, e.stream_type, e.stream_id, e.version, e.type, e.schema_version,
		  e.data, e.recorded_at FROM ` + events + ` e
		WHERE (e.tx_id, e.seq) > ($1::xid8, $2::bigint) AND e.tx_id < pg_snapshot_xmin(pg_current_snapshot())
		  AND e.type = ANY($3::text[])
		ORDER BY e.tx_id, e.seq LIMIT $4`
	c.lockCursor = `SELECT tx_id, seq FROM ` + c.cursor + ` WHERE name = 'raw' FOR UPDATE SKIP LOCKED`
	c.moveCursor = `UPDATE ` + c.cursor + ` SET tx_id = $1, seq = $2 WHERE name = 'raw'`

	pool := store.Pool()
	var exists bool
	if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+events+` WHERE type = $1)`, BackloggedType).Scan(&exists); err != nil {
		return nil, fmt.Errorf("catch-up: look for an earlier backlog: %w", err)
	}
	if exists {
		return nil, fmt.Errorf("catch-up: schema %s already holds a backlog; measure on a fresh schema", store.Schema())
	}
	for _, sql := range []string{
		`CREATE TABLE ` + c.counts + ` (stream_id text PRIMARY KEY, n bigint NOT NULL)`,
		`CREATE TABLE ` + c.cursor + ` (name text PRIMARY KEY, tx_id xid8 NOT NULL, seq bigint NOT NULL)`,
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			return nil, fmt.Errorf("catch-up: create tables: %w", err)
		}
	}
	// 100,000 events per transaction keeps any one transaction modest.
	const chunk = 100_000
	for from := 0; from < cfg.Events; from += chunk {
		to := min(from+chunk, cfg.Events)
		_, err := pool.Exec(ctx, `INSERT INTO `+events+` (id, tenant_id, stream_type, stream_id, version, type, schema_version, data, correlation_id)
			SELECT gen_random_uuid(), $1, 'bench', 's-' || (g % $2), g / $2 + 1, $5, 1, '{"body":"the printer is on fire","n":1}', gen_random_uuid()
			FROM generate_series($3::int, $4::int - 1) g`, projector.SystemTenant, cfg.Streams, from, to, BackloggedType)
		if err != nil {
			return nil, errors.Join(fmt.Errorf("catch-up: insert backlog: %w", err), c.Close(ctx))
		}
	}
	if _, err := pool.Exec(ctx, `ANALYZE `+events); err != nil {
		return nil, errors.Join(fmt.Errorf("catch-up: analyze: %w", err), c.Close(ctx))
	}
	return c, nil
}

// Close drops the read-model and cursor tables, even when ctx is cancelled.
func (c *CatchUp) Close(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	if _, err := c.store.Pool().Exec(ctx, `DROP TABLE IF EXISTS `+c.counts+`, `+c.cursor); err != nil {
		return fmt.Errorf("catch-up: drop tables: %w", err)
	}
	return nil
}

// Measure catches the whole backlog up three times from an empty read
// model: with the one-column raw loop, with the decoding raw loop, then
// with a dispatcher running the projection in form, back to back so drift
// on a shared machine hits all alike. Each side's time runs from start to
// the last batch committed (the dispatcher's from New to Stop); each must
// have counted every backlog event exactly once, or Measure fails.
func (c *CatchUp) Measure(ctx context.Context, form Form) (CatchUpResult, error) {
	res := CatchUpResult{Form: form, Events: c.cfg.Events, BatchSize: c.cfg.BatchSize}
	var p *projection.Async
	switch form {
	case PerEvent, Pipelined:
		p = c.perEvent(form == Pipelined)
	case Batched, BatchedRawPayloads:
		p = c.batched(form == BatchedRawPayloads)
	default:
		return res, fmt.Errorf("catch-up: unknown form %q", form)
	}
	const (
		floor = iota
		decoding
		dispatcher
	)
	for side := range []int{floor, decoding, dispatcher} {
		name := [...]string{"raw loop", "decoding raw loop", "dispatcher"}[side]
		if err := c.reset(ctx); err != nil {
			return res, err
		}
		runtime.GC()
		stopHeap := func() {}
		if side == dispatcher {
			stopHeap = sampleHeap(&res.PeakHeap)
		}
		start := time.Now()
		var err error
		switch side {
		case floor:
			err = c.rawLoop(ctx, form, false)
		case decoding:
			err = c.rawLoop(ctx, form, true)
		default:
			err = c.dispatch(ctx, p)
		}
		took := time.Since(start)
		stopHeap()
		if err != nil {
			return res, fmt.Errorf("catch-up %s, %s: %w", form, name, err)
		}
		if err := c.checkApplied(ctx); err != nil {
			return res, fmt.Errorf("catch-up %s, %s: %w", form, name, err)
		}
		n := int64(c.cfg.Events)
		switch side {
		case floor:
			res.RawEvents, res.RawTime = n, took
		case decoding:
			res.Decoding.RawEvents, res.Decoding.RawTime = n, took
		default:
			res.ProjectorEvents, res.ProjectorTime = n, took
			res.Decoding.ProjectorEvents, res.Decoding.ProjectorTime = n, took
		}
	}
	return res, nil
}

func (c *CatchUp) perEvent(queued bool) *projection.Async {
	p := projection.NewAsync(catchUpConsumer, projection.AsyncConfig{BatchSize: c.cfg.BatchSize})
	// Registration errors surface from projection.New, which validates.
	_ = projection.OnEvent(p, typeName(BackloggedType), func(ctx context.Context, tx pgx.Tx, ev projector.Event) error {
		if queued {
			return projection.Queue(ctx, c.upsert, ev.Stream.ID)
		}
		_, err := tx.Exec(ctx, c.upsert, ev.Stream.ID)
		return err
	})
	return p
}

func (c *CatchUp) batched(rawPayloads bool) *projection.Async {
	p := projection.NewAsync(catchUpConsumer, projection.AsyncConfig{BatchSize: c.cfg.BatchSize, RawPayloads: rawPayloads})
	_ = projection.OnBatch(p, func(ctx context.Context, tx pgx.Tx, batch projection.Batch) error {
		ids := make([]string, len(batch.Streams))
		counts := make([]int64, len(batch.Streams))
		for i, s := range batch.Streams {
			ids[i], counts[i] = s.Stream.ID, int64(len(s.Events))
		}
		_, err := tx.Exec(ctx, c.setUpsert, ids, counts)
		return err
	}, typeName(BackloggedType))
	return p
}

// reset empties the read model and rewinds both sides' cursors.
func (c *CatchUp) reset(ctx context.Context) error {
	pool := c.store.Pool()
	if _, err := pool.Exec(ctx, `TRUNCATE `+c.counts+`, `+c.cursor); err != nil {
		return fmt.Errorf("catch-up: reset read model: %w", err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO `+c.cursor+` VALUES ('raw', '0', 0)`); err != nil {
		return fmt.Errorf("catch-up: reset raw cursor: %w", err)
	}
	if _, err := pool.Exec(ctx, `DELETE FROM `+c.store.Table("projector_consumers")+` WHERE name = $1`, catchUpConsumer); err != nil {
		return fmt.Errorf("catch-up: reset consumer: %w", err)
	}
	return nil
}

func (c *CatchUp) checkApplied(ctx context.Context) error {
	var n int64
	if err := c.store.Pool().QueryRow(ctx, `SELECT coalesce(sum(n), 0) FROM `+c.counts).Scan(&n); err != nil {
		return fmt.Errorf("count applied events: %w", err)
	}
	if n != int64(c.cfg.Events) {
		return fmt.Errorf("applied %d of %d events", n, c.cfg.Events)
	}
	return nil
}

// timeDispatcher catches the whole backlog up once from an empty read
// model with a dispatcher running the projection in form (Batched or
// BatchedRawPayloads), without the raw loops, and returns how long it
// took: what [MeasureTracing] compares, traced and not.
func (c *CatchUp) timeDispatcher(ctx context.Context, form Form) (time.Duration, error) {
	if form != Batched && form != BatchedRawPayloads {
		return 0, fmt.Errorf("catch-up: timeDispatcher takes the batch forms, not %q", form)
	}
	if err := c.reset(ctx); err != nil {
		return 0, err
	}
	runtime.GC()
	start := time.Now()
	if err := c.dispatch(ctx, c.batched(form == BatchedRawPayloads)); err != nil {
		return 0, fmt.Errorf("catch-up %s, dispatcher: %w", form, err)
	}
	took := time.Since(start)
	if err := c.checkApplied(ctx); err != nil {
		return 0, fmt.Errorf("catch-up %s, dispatcher: %w", form, err)
	}
	return took, nil
}

// Dispatch is timeDispatcher for benchmarks outside this package: one
// catch-up of the whole backlog by the dispatcher alone (reset, caught up,
// checked), and how long the dispatcher took.
func (c *CatchUp) Dispatch(ctx context.Context, form Form) (time.Duration, error) {
	return c.timeDispatcher(ctx, form)
}

// WithTracerProvider returns c measuring with the dispatcher traced by tp:
// the same backlog and tables.
func (c *CatchUp) WithTracerProvider(tp trace.TracerProvider) *CatchUp {
	cp := *c
	cp.cfg.TracerProvider = tp
	return &cp
}

// dispatch runs a dispatcher with one pass at a time until it has caught
// up, then stops it.
func (c *CatchUp) dispatch(ctx context.Context, p *projection.Async) error {
	d, err := projection.New(projection.Config{Store: c.store, Projections: []*projection.Async{p}, Concurrency: 1, Logger: quiet,
		TracerProvider: c.cfg.TracerProvider})
	if err != nil {
		return err
	}
	if err := d.Start(ctx); err != nil {
		return err
	}
	return errors.Join(d.CatchUp(ctx), stopDispatcher(ctx, d))
}

// startDispatcher builds and starts a dispatcher running p alone.
func startDispatcher(ctx context.Context, store *postgres.Store, p *projection.Async, concurrency int) (*projection.Dispatcher, error) {
	d, err := projection.New(projection.Config{Store: store, Projections: []*projection.Async{p}, Concurrency: concurrency, Logger: quiet})
	if err != nil {
		return nil, err
	}
	if err := d.Start(ctx); err != nil {
		return nil, err
	}
	return d, nil
}

// stopDispatcher stops d, letting its running batch finish even when ctx
// was cancelled, within the clean-up timeout.
func stopDispatcher(ctx context.Context, d *projection.Dispatcher) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	return d.Stop(ctx)
}

// rawLoop is the baseline: batches of the same size in one transaction
// each, per-event upserts or one set-based upsert per batch. With full
// false it reads the one column the upsert needs (the floor); with full
// true it reads the columns a typical handler uses and, unless form is
// [BatchedRawPayloads], decodes each payload into [Backlogged] with
// encoding/json, as the dispatcher does for the handler.
func (c *CatchUp) rawLoop(ctx context.Context, form Form, full bool) error {
	types := []string{BackloggedType}
	applied := 0
	decode := full && form != BatchedRawPayloads
	var evs []rawEvent // reused across batches, as a careful loop would
	for {
		more, n := false, 0
		err := pgx.BeginFunc(ctx, c.store.Pool(), func(tx pgx.Tx) error {
			var txID uint64
			var seq int64
			if err := tx.QueryRow(ctx, c.lockCursor).Scan(&txID, &seq); err != nil {
				return fmt.Errorf("lock cursor: %w", err)
			}
			read := c.read
			if full {
				read = c.readFull
			}
			rows, err := tx.Query(ctx, read, txID, seq, types, c.cfg.BatchSize)
			if err != nil {
				return fmt.Errorf("read batch: %w", err)
			}
			evs = evs[:0]
			var ev rawEvent
			dest := []any{&ev.txID, &ev.seq, &ev.streamID}
			if full {
				dest = []any{&ev.txID, &ev.seq, &ev.id, &ev.tenant, &ev.streamType, &ev.streamID, &ev.version, &ev.typ,
					&ev.schemaVersion, &ev.data, &ev.recordedAt}
			}
			if _, err := pgx.ForEachRow(rows, dest, func() error {
				if decode {
					var p Backlogged
					if err := json.Unmarshal(ev.data, &p); err != nil {
						return fmt.Errorf("decode %s: %w", ev.typ, err)
					}
					ev.payload = p
				}
				evs = append(evs, ev)
				return nil
			}); err != nil {
				return fmt.Errorf("read batch: %w", err)
			}
			more, n = len(evs) == c.cfg.BatchSize, len(evs)
			if n == 0 {
				return nil
			}
			txID, seq = evs[n-1].txID, evs[n-1].seq
			switch form {
			case Batched, BatchedRawPayloads:
				ids, counts := countByStream(evs)
				if _, err := tx.Exec(ctx, c.setUpsert, ids, counts); err != nil {
					return fmt.Errorf("upsert: %w", err)
				}
			case Pipelined:
				b := &pgx.Batch{}
				for i := range evs {
					b.Queue(c.upsert, evs[i].streamID)
				}
				if err := tx.SendBatch(ctx, b).Close(); err != nil {
					return fmt.Errorf("upsert: %w", err)
				}
			default:
				for i := range evs {
					if _, err := tx.Exec(ctx, c.upsert, evs[i].streamID); err != nil {
						return fmt.Errorf("upsert: %w", err)
					}
				}
			}
			if _, err := tx.Exec(ctx, c.moveCursor, txID, seq); err != nil {
				return fmt.Errorf("move cursor: %w", err)
			}
			return nil
		})
		if err != nil {
			return err
		}
		applied += n
		switch {
		case more:
		case applied >= c.cfg.Events:
			return nil
		default:
			// A transaction elsewhere in the cluster holds the horizon back:
			// the rest of the backlog is there but not yet deliverable.
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(2 * time.Millisecond):
			}
		}
	}
}

// rawEvent is what the raw loops read of an event: the floor fills the
// position and stream id only, the decoding loop all of it.
type rawEvent struct {
	txID          uint64
	seq           int64
	id            [16]byte
	tenant        string
	streamType    string
	streamID      string
	version       int64
	typ           string
	schemaVersion int32
	data          []byte
	recordedAt    time.Time
	payload       Backlogged
}

// countByStream counts each stream's events, streams in order of first
// appearance.
func countByStream(evs []rawEvent) ([]string, []int64) {
	index := map[string]int{}
	var ids []string
	var counts []int64
	for i := range evs {
		s := evs[i].streamID
		k, ok := index[s]
		if !ok {
			k = len(ids)
			index[s] = k
			ids, counts = append(ids, s), append(counts, 0)
		}
		counts[k]++
	}
	return ids, counts
}

// sampleHeap records the peak Go heap in use into peak until the returned
// stop is called.
func sampleHeap(peak *uint64) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		var ms runtime.MemStats
		for {
			runtime.ReadMemStats(&ms)
			*peak = max(*peak, ms.HeapInuse)
			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	})
	return func() { close(done); wg.Wait() }
}
