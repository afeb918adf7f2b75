package benchmark

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

// ConsumersResult is one many-consumers figure: n consumers of the same
// log caught up together by one dispatcher in one process.
type ConsumersResult struct {
	Consumers int
	Events    int // the backlog each consumer applies
	// Counting is the time for all consumers to catch up with the
	// counting batch handler (one unnest upsert per batch into a table of
	// their own), shards at the same position sharing each full batch read
	// (the default).
	Counting time.Duration
	// Separate is the same with projection.Config.SeparateReads: every
	// shard reads every batch itself.
	Separate time.Duration
	// NoOp is the same with handlers that write nothing: what the
	// dispatcher's own work costs (lock, state, log read, cursor, commit).
	NoOp time.Duration
	// ReadOnly is n times one plain read of the whole log in batches (no
	// transaction, no cursor, no handler): the log read alone, which a
	// shared read per process would pay once instead of n times.
	ReadOnly time.Duration
}

// Delivered returns the events per second all consumers applied together.
func (r ConsumersResult) Delivered() float64 {
	return rate(int64(r.Consumers*r.Events), r.Counting)
}

// ReadShare returns the log reads' share of the counting catch-up time.
func (r ConsumersResult) ReadShare() float64 {
	if r.Counting <= 0 {
		return 0
	}
	return r.ReadOnly.Seconds() / r.Counting.Seconds()
}

// MeasureConsumers catches the backlog of c up with n batch-form
// consumers at once (one dispatcher, concurrency as its default), first
// counting, then with no-op handlers, then reads the log n times on its
// own: is the log read a significant share of many consumers' catch-up?
// Every counting consumer must count every event once, or it fails.
func (c *CatchUp) MeasureConsumers(ctx context.Context, n int) (ConsumersResult, error) {
	res := ConsumersResult{Consumers: n, Events: c.cfg.Events}
	if err := within("consumers", n, 1, 1000); err != nil {
		return res, err
	}
	pool := c.store.Pool()
	tables := make([]string, n)
	for i := range tables {
		tables[i] = c.store.Table("bench_counts_c" + strconv.Itoa(i))
		if _, err := pool.Exec(ctx, `DROP TABLE IF EXISTS `+tables[i]+`; CREATE TABLE `+tables[i]+` (stream_id text PRIMARY KEY, n bigint NOT NULL)`); err != nil {
			return res, fmt.Errorf("consumers: create tables: %w", err)
		}
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		for _, t := range tables {
			_, _ = pool.Exec(ctx, `DROP TABLE IF EXISTS `+t)
		}
	}()
	for _, side := range []struct{ counting, separate bool }{{true, true}, {true, false}, {false, false}} {
		counting := side.counting
		if _, err := pool.Exec(ctx, `DELETE FROM `+c.store.Table("projector_consumers")+` WHERE name LIKE 'bench-consumer-%'`); err != nil {
			return res, fmt.Errorf("consumers: reset: %w", err)
		}
		ps := make([]*projection.Async, n)
		for i := range ps {
			upsert := `INSERT INTO ` + tables[i] + ` AS c (stream_id, n) SELECT * FROM unnest($1::text[], $2::bigint[])
				ON CONFLICT (stream_id) DO UPDATE SET n = c.n + excluded.n`
			ps[i] = projection.NewAsync("bench-consumer-"+strconv.Itoa(i), projection.AsyncConfig{BatchSize: c.cfg.BatchSize})
			_ = projection.OnBatch(ps[i], func(ctx context.Context, tx pgx.Tx, b projection.Batch) error {
				if !counting {
					return nil
				}
				ids := make([]string, len(b.Streams))
				counts := make([]int64, len(b.Streams))
				for i, s := range b.Streams {
					ids[i], counts[i] = s.Stream.ID, int64(len(s.Events))
				}
				_, err := tx.Exec(ctx, upsert, ids, counts)
				return err
			}, typeName(BackloggedType))
		}
		runtime.GC()
		start := time.Now()
		d, err := projection.New(projection.Config{Store: c.store, Projections: ps, Logger: quiet, SeparateReads: side.separate})
		if err != nil {
			return res, err
		}
		if err := d.Start(ctx); err != nil {
			return res, err
		}
		err = errors.Join(d.CatchUp(ctx), stopDispatcher(ctx, d))
		took := time.Since(start)
		if err != nil {
			return res, fmt.Errorf("consumers: %d: %w", n, err)
		}
		if !counting {
			res.NoOp = took
			continue
		}
		if side.separate {
			res.Separate = took
		} else {
			res.Counting = took
		}
		for _, t := range tables {
			var sum int64
			if err := pool.QueryRow(ctx, `SELECT coalesce(sum(n), 0) FROM `+t).Scan(&sum); err != nil {
				return res, fmt.Errorf("consumers: count: %w", err)
			}
			if sum != int64(c.cfg.Events) {
				return res, fmt.Errorf("consumers: %s counted %d of %d events", t, sum, c.cfg.Events)
			}
			if _, err := pool.Exec(ctx, `TRUNCATE `+t); err != nil {
				return res, fmt.Errorf("consumers: reset: %w", err)
			}
		}
	}
	start := time.Now()
	for range n {
		if err := readAll(ctx, c.store, c.cfg.BatchSize); err != nil {
			return res, err
		}
	}
	res.ReadOnly = time.Since(start)
	return res, nil
}

// readAll reads the backlog through the store's log read, batch after
// batch, as a consumer would, and drops it.
func readAll(ctx context.Context, store *postgres.Store, size int) error {
	pos := projector.Start
	for {
		b, err := store.ReadLogTx(ctx, store.Pool(), postgres.LogQuery{After: pos, Limit: size, EventTypes: []string{BackloggedType}, Raw: true})
		if err != nil {
			return fmt.Errorf("consumers: read log: %w", err)
		}
		pos = b.Next(pos)
		if !b.Full {
			return nil
		}
	}
}
