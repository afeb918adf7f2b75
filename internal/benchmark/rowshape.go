package benchmark

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/stores/postgres"
)

// ShapeResult is one side of [MeasureRowShapes]: the events it appended and
// the time it took, over every round of the run.
type ShapeResult struct {
	// Name says which side: "outbox-floor", "projector", or a layout of
	// [RowShapes].
	Name   string
	Events int64
	Time   time.Duration
	// Median is the median transaction, measured by
	// [MeasureShapesInterleaved] only.
	Median time.Duration
}

// Rate returns the side's events per second.
func (r ShapeResult) Rate() float64 { return rate(r.Events, r.Time) }

// RowShape is a candidate layout of the event log, measured as a hand-written
// insert beside the outbox floor and Projector's append: what the append could
// reach against the floor if the log had that layout, before any code of
// ours. None of them is the schema; they answer issue 15's "question the row
// width and each index" for layouts a migration could move to.
type RowShape struct {
	// Name identifies the layout in results and benchmark names.
	Name string
	// Doc says what the layout keeps and what it gives up.
	Doc string
	// DDL creates the layout; {{t}} is the table's name, {{h}} the name of
	// its stream-heads table where it has one.
	DDL []string
	// Insert is the statement of one append transaction's events (after the
	// business row); Args its arguments for the transaction's events.
	Insert string
	// InsertFor, when set, replaces Insert with a statement chosen by the
	// number of events per transaction (as the append picks its shape).
	InsertFor func(eventsPerTx int) string
	Args      func(w *shapeWriter) []any
}

// RowShapes returns the layouts [MeasureRowShapes] measures:
//
//   - events-as-is: today's projector_events, created LIKE it INCLUDING
//     ALL (the "raw" side of [MeasureAppend]).
//   - narrow: the same four indexes' worth of features (log order, the
//     per-stream unique key, the type index, the unique event id) on a row
//     that carries a bigint stream number instead of the tenant, stream
//     type and stream id texts, an integer type number instead of the type
//     name, and no actor or headers columns (a nullable jsonb for them,
//     null when empty).
//   - narrow-with-head: narrow, written the way an append would write it,
//     in one statement with the stream head upsert that hands out the
//     stream number and checks promise 4 (the head table keyed by the three
//     texts, as projector_streams is).
//   - narrow-two-indexes: narrow without the type index and the unique
//     event id, keeping only what a stream store cannot do without: log
//     order and the per-stream key.
//   - narrow-stream-commits: narrow with only the primary key on the
//     events, the per-stream key moved to a side table of one row per
//     append (stream number, first and last version, transaction): a stream
//     read would find its commits there and their events by transaction.
//   - commit-rows: one row per append transaction, its events in one jsonb
//     array (the layout of commit-based stores), with log order and the
//     per-stream key on the commit's first version; the type index and
//     event-id lookups would need a GIN index or a side table, not built.
func RowShapes() []RowShape {
	narrowTable := `CREATE TABLE {{t}} (
			tx_id          xid8        NOT NULL DEFAULT pg_current_xact_id(),
			seq            bigint      GENERATED ALWAYS AS IDENTITY,
			id             uuid        NOT NULL,
			stream_no      bigint      NOT NULL,
			version        bigint      NOT NULL,
			type_no        integer     NOT NULL,
			schema_version integer     NOT NULL,
			data           jsonb       NOT NULL,
			correlation_id uuid        NOT NULL,
			causation_id   uuid,
			meta           jsonb,
			recorded_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
			PRIMARY KEY (tx_id, seq)%s)`
	const streamKey = ", UNIQUE (stream_no, version)"
	narrowAll := []string{fmt.Sprintf(narrowTable, streamKey+", UNIQUE (id)"), `CREATE INDEX ON {{t}} (type_no, tx_id, seq)`}
	narrowInsert := `INSERT INTO {{t}} (id, stream_no, version, type_no, schema_version, data, correlation_id)
		SELECT ev.id, $1, ev.v, 7, 1, ev.data, $2
		FROM unnest($3::uuid[], $4::jsonb[], $5::bigint[]) AS ev(id, data, v)`
	narrowArgs := func(w *shapeWriter) []any {
		return []any{w.streamNo, [16]byte(uuid.Must(uuid.NewV7())), w.ids, w.a.datas, w.vers}
	}
	return []RowShape{
		{
			Name: "events-as-is", Doc: "today's projector_events (LIKE … INCLUDING ALL)",
			DDL: []string{`CREATE TABLE {{t}} (LIKE {{events}} INCLUDING ALL)`},
			Insert: `INSERT INTO {{t}} (id, tenant_id, stream_type, stream_id, version, type, schema_version, data, correlation_id, causation_id, actor, headers)
				SELECT ev.id, $1, $2, $3, ev.v, $4, 1, ev.data, $5, NULL, '', NULL
				FROM unnest($6::uuid[], $7::jsonb[], $8::bigint[]) AS ev(id, data, v)`,
			Args: func(w *shapeWriter) []any {
				return []any{projector.SystemTenant, "bench", w.stream, AppendedType, [16]byte(uuid.Must(uuid.NewV7())), w.ids, w.a.datas, w.vers}
			},
		},
		{Name: "narrow", Doc: "stream number, type number, metadata jsonb; all four indexes", DDL: narrowAll, Insert: narrowInsert, Args: narrowArgs},
		{
			Name: "narrow-with-head", Doc: "narrow, in one statement with the stream head upsert",
			DDL: append(slices.Clone(narrowAll), `CREATE TABLE {{h}} (
				stream_no   bigint GENERATED ALWAYS AS IDENTITY,
				tenant_id   text   NOT NULL,
				stream_type text   NOT NULL,
				stream_id   text   NOT NULL,
				version     bigint NOT NULL,
				last_tx_id  xid8   NOT NULL,
				updated_at  timestamptz NOT NULL DEFAULT now(),
				PRIMARY KEY (tenant_id, stream_type, stream_id)) WITH (fillfactor = 80)`),
			Insert: `WITH head AS (
					INSERT INTO {{h}} AS s (tenant_id, stream_type, stream_id, version, last_tx_id)
					VALUES ($1, $2, $3, $4, pg_current_xact_id())
					ON CONFLICT (tenant_id, stream_type, stream_id) DO UPDATE
						SET version = s.version + $4, last_tx_id = pg_current_xact_id(), updated_at = now()
						WHERE s.last_tx_id <= pg_current_xact_id()
					RETURNING s.stream_no, s.version)
				INSERT INTO {{t}} (id, stream_no, version, type_no, schema_version, data, correlation_id)
				SELECT ev.id, head.stream_no, head.version - $4 + ev.ord, 7, 1, ev.data, $5
				FROM head, unnest($6::uuid[], $7::jsonb[]) WITH ORDINALITY AS ev(id, data, ord)
				ORDER BY ev.ord`,
			Args: func(w *shapeWriter) []any {
				return []any{projector.SystemTenant, "bench", w.stream, int64(w.a.n), [16]byte(uuid.Must(uuid.NewV7())), w.ids, w.a.datas}
			},
		},
		{Name: "narrow-two-indexes", Doc: "narrow with only the primary key and the per-stream key",
			DDL: []string{fmt.Sprintf(narrowTable, streamKey)}, Insert: narrowInsert, Args: narrowArgs},
		{
			Name: "narrow-stream-commits", Doc: "narrow with the primary key only; the per-stream key on one row per append in a side table",
			DDL: []string{fmt.Sprintf(narrowTable, ""), `CREATE TABLE {{h}} (
				stream_no     bigint NOT NULL,
				first_version bigint NOT NULL,
				last_version  bigint NOT NULL,
				tx_id         xid8   NOT NULL DEFAULT pg_current_xact_id(),
				PRIMARY KEY (stream_no, first_version))`},
			Insert: `WITH c AS (INSERT INTO {{h}} (stream_no, first_version, last_version) VALUES ($1, $6, $7))
				` + narrowInsert,
			Args: func(w *shapeWriter) []any {
				return append(narrowArgs(w), w.vers[0], w.vers[len(w.vers)-1])
			},
		},
		{
			Name: "commit-rows", Doc: "one row per append, its events in a jsonb array",
			DDL: []string{`CREATE TABLE {{t}} (
				tx_id          xid8        NOT NULL DEFAULT pg_current_xact_id(),
				seq            bigint      GENERATED ALWAYS AS IDENTITY,
				stream_no      bigint      NOT NULL,
				first_version  bigint      NOT NULL,
				last_version   bigint      NOT NULL,
				correlation_id uuid        NOT NULL,
				recorded_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
				events         jsonb       NOT NULL,
				PRIMARY KEY (tx_id, seq),
				UNIQUE (stream_no, first_version))`},
			Insert: `INSERT INTO {{t}} (stream_no, first_version, last_version, correlation_id, events) VALUES ($1, $2, $3, $4, $5::jsonb)`,
			Args: func(w *shapeWriter) []any {
				var b strings.Builder
				b.WriteByte('[')
				for j, d := range w.a.datas {
					if j > 0 {
						b.WriteByte(',')
					}
					fmt.Fprintf(&b, `{"id":%q,"type":%q,"sv":1,"data":%s}`, uuid.UUID(w.ids[j]).String(), AppendedType, d)
				}
				b.WriteByte(']')
				return []any{w.streamNo, w.vers[0], w.vers[len(w.vers)-1], [16]byte(uuid.Must(uuid.NewV7())), b.String()}
			},
		},
	}
}

// shapeWriter appends for one goroutine to one layout; the floor's
// [AppendWriter] of the same writer id writes its business rows.
type shapeWriter struct {
	a        *Appender
	biz      *AppendWriter
	shape    RowShape
	insert   string
	ops      int
	stream   string
	writer   int64 // the writer's number: the high half of its stream numbers
	streamNo int64
	ids      [][16]byte
	vers     []int64
}

// append runs one transaction: the business row, then the layout's insert.
func (w *shapeWriter) append(ctx context.Context) error {
	a, op := w.a, w.ops
	w.stream = w.biz.stream(op)
	w.streamNo = w.writer<<32 | int64(op/10)
	for j := range a.n {
		w.ids[j], w.vers[j] = uuid.Must(uuid.NewV7()), int64((op%10)*a.n+j+1)
	}
	err := pgx.BeginFunc(ctx, a.store.Pool(), func(tx pgx.Tx) error {
		if err := w.biz.businessRow(ctx, tx, w.stream); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, w.insert, w.shape.Args(w)...)
		return err
	})
	if err != nil {
		return fmt.Errorf("%s insert: %w", w.shape.Name, err)
	}
	w.ops++
	return nil
}

// MeasureRowShapes measures the append of cfg.EventsPerTx events per
// transaction with cfg.Writers writers, each transaction with its business
// row, on the outbox floor, Projector's append, and a hand-written insert
// into each layout of [RowShapes] — all sides taking turns in slices of
// about 200ms of the same run, like [MeasureAppend]. It returns the floor
// first, then Projector, then the layouts in order. The layouts' tables
// are created in store's schema and dropped before it returns.
func MeasureRowShapes(ctx context.Context, store *postgres.Store, cfg AppendConfig) (res []ShapeResult, err error) {
	return MeasureShapes(ctx, store, cfg, RowShapes())
}

// MeasureShapes is [MeasureRowShapes] over the layouts given, in their
// order after the floor and Projector: [RowShapes], [HeadShapes], or both.
func MeasureShapes(ctx context.Context, store *postgres.Store, cfg AppendConfig, shapes []RowShape) (res []ShapeResult, err error) {
	return measureShapes(ctx, store, cfg, shapes, false)
}

// MeasureShapesInterleaved is [MeasureShapes] op by op with one writer
// (cfg.Writers is ignored): each round runs one transaction of every side
// in turn until cfg.Duration has passed, and each side's [ShapeResult]
// carries the median transaction. On a loaded machine, where the
// scheduler and the other sessions' flushes move 200ms slices by tens of
// points, the median of interleaved transactions is the figure that still
// tells one statement from another.
func MeasureShapesInterleaved(ctx context.Context, store *postgres.Store, cfg AppendConfig, shapes []RowShape) (res []ShapeResult, err error) {
	cfg.Writers = 1
	return measureShapes(ctx, store, cfg, shapes, true)
}

func measureShapes(ctx context.Context, store *postgres.Store, cfg AppendConfig, shapes []RowShape, interleaved bool) (res []ShapeResult, err error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("measure row shapes: %w", err)
	}
	a, closeWriters, err := openWriters(ctx, store, cfg)
	if err != nil {
		return nil, fmt.Errorf("measure row shapes: %w", err)
	}
	defer func() { err = errors.Join(err, closeWriters()) }()
	pool := a.store.Pool()

	var tables []string
	defer func() {
		if len(tables) == 0 {
			return
		}
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		if _, derr := pool.Exec(cctx, `DROP TABLE IF EXISTS `+strings.Join(tables, ", ")); derr != nil {
			err = errors.Join(err, fmt.Errorf("measure row shapes: drop layouts: %w", derr))
		}
	}()
	ops := []func(*AppendWriter, context.Context) error{(*AppendWriter).Floor, (*AppendWriter).Projector}
	res = []ShapeResult{{Name: "outbox-floor"}, {Name: "projector"}}
	writers := make([]*AppendWriter, cfg.Writers)
	for i := range writers {
		writers[i] = a.Writer(i)
	}
	var shapeWriters [][]*shapeWriter
	for i, s := range shapes {
		t := store.Table(fmt.Sprintf("bench_shape_%d_%s", i, a.prefix))
		h := store.Table(fmt.Sprintf("bench_shape_%d_%s_heads", i, a.prefix))
		tables = append(tables, t, h)
		r := strings.NewReplacer("{{t}}", t, "{{h}}", h, "{{events}}", store.Table("projector_events"))
		for _, ddl := range s.DDL {
			if _, err := pool.Exec(ctx, r.Replace(ddl)); err != nil {
				return nil, fmt.Errorf("measure row shapes: create %s: %w", s.Name, err)
			}
		}
		ws := make([]*shapeWriter, cfg.Writers)
		for k := range ws {
			insert := s.Insert
			if s.InsertFor != nil {
				insert = s.InsertFor(cfg.EventsPerTx)
			}
			ws[k] = &shapeWriter{a: a, biz: writers[k], writer: int64(k), shape: s, insert: r.Replace(insert),
				ids: make([][16]byte, cfg.EventsPerTx), vers: make([]int64, cfg.EventsPerTx)}
		}
		shapeWriters = append(shapeWriters, ws)
		res = append(res, ShapeResult{Name: s.Name})
	}

	if interleaved {
		return res, interleave(ctx, cfg, res, writers[0], ops, shapeWriters)
	}
	sides := len(ops) + len(shapes)
	rounds := max(1, int(cfg.Duration/(time.Duration(sides)*appendSlice)))
	slice := cfg.Duration / time.Duration(sides*rounds)
	for range rounds {
		for i, op := range ops {
			n, took, err := appendPhase(ctx, writers, op, slice)
			if err != nil {
				return nil, fmt.Errorf("measure row shapes: %s: %w", res[i].Name, err)
			}
			res[i].Events += n * int64(cfg.EventsPerTx)
			res[i].Time += took
		}
		for k, ws := range shapeWriters {
			n, took, err := appendPhase(ctx, ws, (*shapeWriter).append, slice)
			if err != nil {
				return nil, fmt.Errorf("measure row shapes: %w", err)
			}
			res[len(ops)+k].Events += n * int64(cfg.EventsPerTx)
			res[len(ops)+k].Time += took
		}
	}
	return res, nil
}

// interleave runs one transaction of every side in turn, one writer, until
// cfg.Duration has passed, and fills res with the totals and the medians.
func interleave(ctx context.Context, cfg AppendConfig, res []ShapeResult, w *AppendWriter, ops []func(*AppendWriter, context.Context) error, shapeWriters [][]*shapeWriter) error {
	took := make([][]time.Duration, len(res))
	deadline := time.Now().Add(cfg.Duration)
	// Each round starts one side later, so no side always runs right after
	// the same other side's commit.
	for round := 0; time.Now().Before(deadline); round++ {
		for k := range res {
			i := (round + k) % len(res)
			start := time.Now()
			var err error
			if i < len(ops) {
				err = ops[i](w, ctx)
			} else {
				err = shapeWriters[i-len(ops)][0].append(ctx)
			}
			if err != nil {
				return fmt.Errorf("measure row shapes: %s: %w", res[i].Name, err)
			}
			d := time.Since(start)
			took[i] = append(took[i], d)
			res[i].Events += int64(cfg.EventsPerTx)
			res[i].Time += d
		}
	}
	for i, ds := range took {
		slices.Sort(ds)
		res[i].Median = ds[len(ds)/2]
	}
	return nil
}
