package benchmark

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

// Defaults of [LatencyConfig].
const (
	DefaultRate            = 500
	DefaultLatencyDuration = 3 * time.Second
)

// drainTimeout is how long a latency run waits, after its last append, for
// the last events to arrive before it calls them lost.
const drainTimeout = 10 * time.Second

// LatencyConfig sizes a latency measurement. Zero fields take the defaults.
type LatencyConfig struct {
	// Rate is the events appended per second on average, one per
	// transaction, at random times (a Poisson process); default
	// [DefaultRate].
	Rate int
	// Duration is how long each side appends; default
	// [DefaultLatencyDuration].
	Duration time.Duration
	// PollMin is the dispatcher sides' projection.Config.PollMin, the
	// probe interval while events keep arriving: what the polled side's
	// median mostly waits for. Zero takes the dispatcher's default.
	PollMin time.Duration
}

func (c LatencyConfig) withDefaults() LatencyConfig {
	c.Rate = cmp.Or(c.Rate, DefaultRate)
	c.Duration = cmp.Or(c.Duration, DefaultLatencyDuration)
	return c
}

func (c LatencyConfig) validate() error {
	return errors.Join(within("rate", c.Rate, 1, 100_000), notNegative("latency duration", c.Duration),
		notNegative("poll interval", c.PollMin))
}

// Side is what carries an event from its append's commit to the code that
// reacts to it.
type Side string

const (
	// ListenNotify is the raw floor: the appending transaction also runs
	// pg_notify, and a connection that LISTENs receives it. The fastest push
	// PostgreSQL has.
	ListenNotify Side = "raw-notify"
	// Dispatcher is Projector: a dispatcher applies the event with a no-op
	// handler and reports it through AsyncConfig.AfterCommit once the
	// batch's transaction committed. It runs on the appenders' Store, as in
	// an application that appends and dispatches in one process, so it is
	// hinted of each append (postgres.Store.WatchAppends).
	Dispatcher Side = "projector"
	// PolledDispatcher is the same dispatcher on a Store of its own (same
	// pool and schema): it learns of appends only by polling the log, as a
	// dispatcher in another process does.
	PolledDispatcher Side = "projector-polled"
)

// LatencyResult is the latency figure: every side's percentiles at one rate.
type LatencyResult struct {
	Rate           int
	Raw, Projector Percentiles
	// Polled is the dispatcher that sees appends only by polling
	// ([PolledDispatcher]).
	Polled Percentiles
}

// MeasureLatency measures every side on store, the raw floor first, each
// for cfg.Duration at cfg.Rate. See [LatencySamples].
func MeasureLatency(ctx context.Context, store *postgres.Store, cfg LatencyConfig) (LatencyResult, error) {
	cfg = cfg.withDefaults()
	res := LatencyResult{Rate: cfg.Rate}
	for _, side := range []Side{ListenNotify, Dispatcher, PolledDispatcher} {
		samples, err := LatencySamples(ctx, store, side, cfg)
		if err != nil {
			return res, err
		}
		switch side {
		case ListenNotify:
			res.Raw = Summarize(samples)
		case Dispatcher:
			res.Projector = Summarize(samples)
		default:
			res.Polled = Summarize(samples)
		}
	}
	return res, nil
}

// latencyConsumer is the dispatcher side's consumer name; its state row is
// reset before every run, so it starts at the log's head.
const latencyConsumer = "bench-latency"

// LatencySamples appends one event per transaction, each to a new stream,
// at random times averaging cfg.Rate a second (a Poisson process) for
// cfg.Duration, and returns for each event the time from
// its transaction's commit (when the appender's COMMIT returned) to its
// arrival on side. An arrival that beats the appender's own view of the
// commit counts as zero. It fails if an event has not arrived within ten
// seconds of the last append.
//
// Stream ids and the notification channel carry a random run id, so runs
// on one database at once (tests in parallel, say) do not hear each other.
func LatencySamples(ctx context.Context, store *postgres.Store, side Side, cfg LatencyConfig) ([]time.Duration, error) {
	run, err := MeasureLatencyRun(ctx, store, side, cfg)
	return run.Samples, err
}

// LatencyRun is one side's run of [MeasureLatencyRun].
type LatencyRun struct {
	// Samples are the events' latencies, as [LatencySamples] returns them.
	Samples []time.Duration
	// Batches is how many batches a dispatcher side committed to deliver
	// them (zero on the raw side): with one event per pass, every event
	// cost the dispatcher a transaction of its own.
	Batches int64
}

// MeasureLatencyRun is [LatencySamples] with the number of batches the
// dispatcher committed: what a shorter poll costs in transactions.
func MeasureLatencyRun(ctx context.Context, store *postgres.Store, side Side, cfg LatencyConfig) (res LatencyRun, err error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return res, fmt.Errorf("latency: %w", err)
	}
	if err := checkRegistry(store, TimedType, Timed{}); err != nil {
		return res, fmt.Errorf("latency: %w", err)
	}
	run := "l" + randomHex(4) + "-"
	channel := SchemaPrefix + run[:len(run)-1]
	tr := newTracker(run)
	var stop func() error
	switch side {
	case Dispatcher:
		stop, err = startLatencyDispatcher(ctx, store, tr, cfg.PollMin)
	case PolledDispatcher:
		var own *postgres.Store
		own, err = postgres.New(ctx, store.Pool(), postgres.Config{Schema: store.Schema(), Registry: store.Registry(), Logger: quiet})
		if err == nil {
			stop, err = startLatencyDispatcher(ctx, own, tr, cfg.PollMin)
		}
	case ListenNotify:
		stop, err = listen(ctx, store, channel, tr)
	default:
		return res, fmt.Errorf("latency: unknown side %q", side)
	}
	if err != nil {
		return res, fmt.Errorf("latency %s: %w", side, err)
	}
	defer func() { err = errors.Join(err, stop()) }()

	// Arrivals at random, a Poisson process of cfg.Rate a second, as
	// independent requests arrive: a fixed tick of the same period as the
	// dispatcher's poll (2ms at 500 events/s) would hold the two in one
	// phase for a whole run and measure that phase, not the poll.
	period := float64(time.Second) / float64(cfg.Rate)
	next := time.Now()
	timer := time.NewTimer(0)
	defer timer.Stop()
	end := next.Add(cfg.Duration)
	for i := 0; time.Now().Before(end); i++ {
		select {
		case <-ctx.Done():
			return res, fmt.Errorf("latency %s: %w", side, ctx.Err())
		case <-timer.C:
		}
		next = next.Add(time.Duration(rand.ExpFloat64() * period))
		timer.Reset(time.Until(next))
		id := run + strconv.Itoa(i)
		err := pgx.BeginFunc(ctx, store.Pool(), func(tx pgx.Tx) error {
			if _, err := store.Append(ctx, tx, projector.Stream("bench", id), projector.NoStream, Timed{Title: "t"}); err != nil {
				return err
			}
			if side == ListenNotify {
				_, err := tx.Exec(ctx, `SELECT pg_notify($1, $2)`, channel, id)
				return err
			}
			return nil
		})
		if err != nil {
			return res, fmt.Errorf("latency %s: append: %w", side, err)
		}
		tr.committed(id, time.Now())
	}
	if err := tr.drain(ctx, drainTimeout); err != nil {
		return res, fmt.Errorf("latency %s: %w", side, err)
	}
	res.Samples, res.Batches = tr.samples(), tr.batches.Load()
	return res, nil
}

// startLatencyDispatcher runs a dispatcher whose only projection reports
// the events it applied to tr.
func startLatencyDispatcher(ctx context.Context, store *postgres.Store, tr *tracker, pollMin time.Duration) (stop func() error, err error) {
	if _, err := store.Pool().Exec(ctx, `DELETE FROM `+store.Table("projector_consumers")+` WHERE name = $1`, latencyConsumer); err != nil {
		return nil, fmt.Errorf("reset consumer: %w", err)
	}
	p := projection.NewAsync(latencyConsumer, projection.AsyncConfig{StartFrom: projection.FromNow, AfterCommit: func(evs []projector.Event) {
		tr.batches.Add(1)
		now := time.Now()
		for _, ev := range evs {
			tr.arrived(ev.Stream.ID, now)
		}
	}})
	_ = projection.OnEvent(p, typeName(TimedType), func(context.Context, pgx.Tx, projector.Event) error { return nil })
	d, err := projection.New(projection.Config{Store: store, Projections: []*projection.Async{p}, PollMin: pollMin, Logger: quiet})
	if err != nil {
		return nil, err
	}
	if err := d.Start(ctx); err != nil {
		return nil, err
	}
	return func() error { return stopDispatcher(ctx, d) }, nil
}

// listen LISTENs on channel on a connection of its own and reports each
// notification's payload to tr until stop.
func listen(ctx context.Context, store *postgres.Store, channel string, tr *tracker) (stop func() error, err error) {
	conn, err := store.Pool().Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("acquire listener: %w", err)
	}
	if _, err := conn.Exec(ctx, `LISTEN `+pgx.Identifier{channel}.Sanitize()); err != nil {
		conn.Release()
		return nil, fmt.Errorf("listen: %w", err)
	}
	lctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			n, err := conn.Conn().WaitForNotification(lctx)
			if err != nil {
				return
			}
			tr.arrived(n.Payload, time.Now())
		}
	})
	return func() error {
		cancel()
		wg.Wait()
		// Closed rather than returned LISTENing: the pool discards it.
		cctx, ccancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer ccancel()
		_ = conn.Conn().Close(cctx)
		conn.Release()
		return nil
	}, nil
}

// tracker pairs each event's commit with its arrival, whichever is noted
// first.
type tracker struct {
	run     string // ids of this run start with it
	mu      sync.Mutex
	pending map[string]time.Time
	lat     []time.Duration
	changed chan struct{} // signalled, without blocking, on every pairing
	batches atomic.Int64  // the dispatcher's committed batches
}

func newTracker(run string) *tracker {
	return &tracker{run: run, pending: map[string]time.Time{}, changed: make(chan struct{}, 1)}
}

func (t *tracker) committed(id string, at time.Time) {
	t.pair(id, func(arrived time.Time) time.Duration { return max(arrived.Sub(at), 0) }, at)
}

func (t *tracker) arrived(id string, at time.Time) {
	if !strings.HasPrefix(id, t.run) {
		return
	}
	t.pair(id, func(committed time.Time) time.Duration { return at.Sub(committed) }, at)
}

// pair records the latency if id's other half was noted, else notes at.
func (t *tracker) pair(id string, latency func(other time.Time) time.Duration, at time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	other, ok := t.pending[id]
	if !ok {
		t.pending[id] = at
		return
	}
	delete(t.pending, id)
	t.lat = append(t.lat, latency(other))
	select {
	case t.changed <- struct{}{}:
	default:
	}
}

// drain waits until every committed event has arrived, for at most
// timeout.
func (t *tracker) drain(ctx context.Context, timeout time.Duration) error {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		t.mu.Lock()
		left := len(t.pending)
		t.mu.Unlock()
		if left == 0 {
			return nil
		}
		select {
		case <-t.changed:
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline.C:
			return fmt.Errorf("%d events had not arrived %v after the last append", left, timeout)
		}
	}
}

func (t *tracker) samples() []time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.lat
}
