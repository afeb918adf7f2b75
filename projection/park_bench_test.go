package projection_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/projection"
)

// BenchmarkParkedCatchUp measures what parked streams cost the healthy ones:
// a consumer catches up a backlog over 1,000 streams in which 1 % of the
// streams fail from their second event on (ParkStream, MaxAttempts 2),
// beside the same consumer catching up the same backlog with no failure, in
// the same run (the baseline). healthy-%-of-clean is the healthy streams'
// events per second with the poisoned streams parked, as a percentage of
// the events per second without failures: the goal is at least 95. Per-event
// (an upsert per event) and batch (one unnest upsert per batch) handlers;
// the batch handler either returns a plain error (batch: the dispatcher
// bisects the batch to find the failing event) or names the event it failed
// on (batch-named: projection.EventFailed).
func BenchmarkParkedCatchUp(b *testing.B) {
	e := newEnv(b)
	const streams = 1000
	n := min(benchEvents(), 50_000)
	versions := e.appendMany(8, n, streams)
	var poisoned, healthy int64
	for id, v := range versions {
		if isPoisoned(id) {
			poisoned++
		} else {
			healthy += v
		}
	}
	if poisoned == 0 {
		b.Fatal("no stream is poisoned")
	}
	total := float64(total(versions))
	round := 0
	for _, form := range []string{"per-event", "batch", "batch-named"} {
		b.Run(fmt.Sprintf("events=%d/poisoned-streams=%d/%s", int(total), poisoned, form), func(b *testing.B) {
			var clean, parked time.Duration
			for b.Loop() {
				round++
				clean += e.timeCatchUp(b, parkBenchProjection(e, fmt.Sprintf("clean_%d", round), form, false))
				parked += e.timeCatchUp(b, parkBenchProjection(e, fmt.Sprintf("parked_%d", round), form, true))
			}
			cleanRate, healthyRate := total*float64(b.N)/clean.Seconds(), float64(healthy)*float64(b.N)/parked.Seconds()
			b.ReportMetric(cleanRate, "clean-events/s")
			b.ReportMetric(healthyRate, "healthy-events/s")
			b.ReportMetric(100*healthyRate/cleanRate, "healthy-%-of-clean")
		})
	}
}

// isPoisoned picks 1 % of the streams s-0 … s-999.
func isPoisoned(id string) bool { return strings.HasSuffix(id, "00") || id == "s-0" }

// timeCatchUp runs a dispatcher of p alone until it has caught up.
func (e *env) timeCatchUp(b *testing.B, p *projection.Async) time.Duration {
	b.Helper()
	d, err := projection.New(projection.Config{Store: e.store, Projections: []*projection.Async{p}, Logger: quiet,
		PollMax: 5 * time.Millisecond, Recheck: 5 * time.Millisecond})
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	if err := d.Start(e.ctx); err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(e.ctx, 5*time.Minute)
	defer cancel()
	if err := d.CatchUp(ctx); err != nil {
		b.Fatal(err)
	}
	took := time.Since(start)
	if err := d.Stop(ctx); err != nil {
		b.Fatal(err)
	}
	return took
}

var errPoison = errors.New("poisoned stream")

// parkBenchAttempts is MaxAttempts of the benchmark's consumers:
// PROJECTOR_BENCH_PARK_ATTEMPTS, default 1 (parked at the first failure).
var parkBenchAttempts = func() int {
	if n, err := strconv.Atoi(os.Getenv("PROJECTOR_BENCH_PARK_ATTEMPTS")); err == nil && n > 0 {
		return n
	}
	return 1
}()

// parkBenchProjection counts events per stream into counts, failing (when
// poison) on the events after the first of the poisoned streams.
func parkBenchProjection(e *env, name, form string, poison bool) *projection.Async {
	p := projection.NewAsync(name, projection.AsyncConfig{ErrorMode: projection.ParkStream, MaxAttempts: parkBenchAttempts,
		RetryBackoff: time.Millisecond, MaxBackoff: time.Millisecond})
	fails := func(ev projector.Event) bool { return poison && ev.Version > 1 && isPoisoned(ev.Stream.ID) }
	if form == "per-event" {
		count := countingHandler(e.schema, name)
		h := func(ctx context.Context, tx pgx.Tx, ev projector.Event) error {
			if fails(ev) {
				return errPoison
			}
			return count(ctx, tx, ev)
		}
		must(projection.OnEvent(p, e.types.Opened, h))
		must(projection.OnEvent(p, e.types.Commented, h))
		return p
	}
	sql := `INSERT INTO ` + e.table("counts") + ` AS c (consumer, stream_id, n, last_version)
		SELECT $1, s, n, v FROM unnest($2::text[], $3::int[], $4::bigint[]) AS u(s, n, v)
		ON CONFLICT (consumer, stream_id) DO UPDATE SET n = c.n + excluded.n, last_version = excluded.last_version`
	must(projection.OnBatch(p, func(ctx context.Context, tx pgx.Tx, batch projection.Batch) error {
		var ids []string
		var ns []int
		var vs []int64
		for _, s := range batch.Streams {
			for _, ev := range s.Events {
				if fails(ev) && form == "batch-named" {
					return projection.EventFailed(ev, errPoison)
				}
				if fails(ev) {
					return errPoison
				}
			}
			ids, ns, vs = append(ids, s.Stream.ID), append(ns, len(s.Events)), append(vs, s.Events[len(s.Events)-1].Version)
		}
		_, err := tx.Exec(ctx, sql, name, ids, ns, vs)
		return err
	}, e.types.Opened, e.types.Commented))
	return p
}
