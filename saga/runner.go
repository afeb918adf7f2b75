package saga

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/tracing"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

// Definition is a saga type as a [Runner] sees it: any *Saga[S].
type Definition interface {
	Name() string
	Now() time.Time
	// Personal declares the state's personal fields (Config.Personal).
	Personal() projector.Personal
	Validate(reg *projector.Registry) error
	// Projection is the consumer that takes the saga's event steps, for
	// the dispatcher the runner is started beside.
	Projection(store *postgres.Store) (*projection.Async, error)
	// Ignored, Late, DeadLettered and Parked are the saga's counters of events it
	// did not take a step for, exported as metrics by a runner with a
	// Registerer.
	Ignored() int64
	Late() int64
	DeadLettered() int64
	// Parked counts the instances ParkStream parked.
	Parked() int64
	fireDue(ctx context.Context, store *postgres.Store, q queries, tracer trace.Tracer, limit int, fired func(lateness time.Duration)) (n, claimed int, err error)
	nextDue(ctx context.Context, store *postgres.Store, q queries) (time.Time, error)
}

// DefaultPoll is how often a [Runner] looks for due timeouts when none is
// due sooner: the dispatcher's slowest poll of the log, so the runner never
// polls faster than the dispatcher beside it does.
const DefaultPoll = projection.DefaultPollMax

// DefaultBatchSize is how many due timeouts a [Runner] fires per
// transaction by default.
const DefaultBatchSize = 100

// RunnerConfig configures a [Runner]. Store and Sagas are required.
type RunnerConfig struct {
	Store *postgres.Store
	Sagas []Definition
	// Poll is the longest the runner sleeps between looks for due
	// timeouts; it wakes earlier when the earliest pending one is due
	// sooner. Default [DefaultPoll]; between [projection.MinPoll] and
	// [projection.MaxPoll].
	Poll time.Duration
	// BatchSize caps the timeouts fired in one transaction (each step under
	// a savepoint of its own); default [DefaultBatchSize]. The instances of
	// a batch stay locked until it commits, so an event's step for one of
	// them waits that long.
	BatchSize int
	Logger    *slog.Logger
	// TracerProvider traces each fired timeout's step (docs/tracing.md):
	// a span linked to the step that scheduled it. Nil means the global
	// provider. Pass the dispatcher's.
	TracerProvider trace.TracerProvider
	// Registerer receives the runner's metrics (docs/operations.md): per
	// saga, the events ignored and the late events, the timeouts fired and
	// how late they fired. Nil means no metrics. Pass the dispatcher's.
	Registerer prometheus.Registerer
}

// Runner fires the due timeouts of its sagas: started beside the
// dispatcher in every process that runs the sagas. A transaction claims a
// batch of due timeouts with their instances locked (so a timeout never
// races an event's step), and for each, under a savepoint, runs the
// timeout's handler, applies the step and deletes the timeout: a timeout
// fires once, at or after its due time by the saga's clock, never before,
// and a crash before the commit leaves it pending.
type Runner struct {
	cfg     RunnerConfig
	q       queries
	tracer  trace.Tracer
	logger  *slog.Logger
	metrics *runnerMetrics // nil without a Registerer

	mu      sync.Mutex
	started bool
	cancel  context.CancelFunc
	stopped chan struct{}
	wake    chan struct{}
}

// NewRunner returns a runner for cfg's sagas; zero fields take their
// documented defaults.
func NewRunner(cfg RunnerConfig) (*Runner, error) {
	if cfg.Store == nil {
		return nil, errors.New("saga runner: RunnerConfig.Store is required")
	}
	if len(cfg.Sagas) == 0 {
		return nil, errors.New("saga runner: no sagas")
	}
	seen := map[string]bool{}
	for _, s := range cfg.Sagas {
		if s == nil {
			return nil, errors.New("saga runner: nil saga")
		}
		if seen[s.Name()] {
			return nil, fmt.Errorf("%w: saga %q registered twice", ErrInvalidDefinition, s.Name())
		}
		seen[s.Name()] = true
		if err := s.Validate(cfg.Store.Registry()); err != nil {
			return nil, err
		}
		if err := cfg.Store.CheckMasterKey(fmt.Sprintf("saga %q: Config.Personal", s.Name())); s.Personal().Subject != "" && err != nil {
			return nil, err
		}
	}
	cfg.Poll = cmp.Or(cfg.Poll, DefaultPoll)
	cfg.BatchSize = cmp.Or(cfg.BatchSize, DefaultBatchSize)
	if cfg.Poll < projection.MinPoll || cfg.Poll > projection.MaxPoll {
		// Below a millisecond an idle runner spins through transactions.
		return nil, fmt.Errorf("%w: saga runner: poll %v outside %v..%v", ErrInvalidDefinition, cfg.Poll, projection.MinPoll, projection.MaxPoll)
	}
	if cfg.BatchSize < 1 || cfg.BatchSize > 10_000 {
		return nil, fmt.Errorf("%w: saga runner: batch size %d outside 1..10000", ErrInvalidDefinition, cfg.BatchSize)
	}
	r := &Runner{cfg: cfg, q: newQueries(cfg.Store), tracer: tracing.Tracer(cfg.TracerProvider), logger: cmp.Or(cfg.Logger, slog.Default()),
		stopped: make(chan struct{}), wake: make(chan struct{}, 1)}
	if cfg.Registerer != nil {
		m, err := newRunnerMetrics(cfg.Registerer, cfg.Sagas)
		if err != nil {
			return nil, err
		}
		r.metrics = m
	}
	return r, nil
}

// FireDue fires every timeout of the runner's sagas that is due now, each
// in its own transaction, and returns how many steps it took. A failing
// timeout is recorded (retried later with backoff) and counted; FireDue
// goes on with the others and returns the first such error with the count.
// The running loop calls it; tests call it after moving their clock.
func (r *Runner) FireDue(ctx context.Context) (int, error) {
	n := 0
	var first error
	for _, s := range r.cfg.Sagas {
		for rounds := 0; ; rounds++ {
			fired, claimed, err := s.fireDue(ctx, r.cfg.Store, r.q, r.tracer, r.cfg.BatchSize, r.metrics.fired(s.Name()))
			n += fired
			if ctx.Err() != nil {
				return n, ctx.Err()
			}
			if err != nil && claimed == 0 {
				return n, err // the database failed: stop this round
			}
			if err != nil && first == nil {
				first = err
			}
			// A full claim means more may be due. A round that fired
			// nothing of a full claim was all contention or failures:
			// those wait for the next look rather than spin.
			if claimed < r.cfg.BatchSize || fired == 0 {
				break
			}
		}
	}
	return n, first
}

// Wake makes a running loop look for due timeouts now: for tests that move
// an injected clock.
func (r *Runner) Wake() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// Start starts the firing loop; it runs until ctx ends or Stop. Calling it
// twice is an error.
func (r *Runner) Start(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.started {
		return errors.New("saga runner: already started")
	}
	r.started = true
	ctx, r.cancel = context.WithCancel(ctx)
	go r.loop(ctx)
	return nil
}

// Stop stops the loop and waits for it (or for ctx). A step in flight is
// rolled back and fires again later. Safe to call twice, and before Start.
func (r *Runner) Stop(ctx context.Context) error {
	r.mu.Lock()
	started, cancel := r.started, r.cancel
	r.mu.Unlock()
	if !started {
		return nil
	}
	cancel()
	select {
	case <-r.stopped:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("saga runner: stop: %w", ctx.Err())
	}
}

// Stopped is closed when a started loop has ended.
func (r *Runner) Stopped() <-chan struct{} { return r.stopped }

func (r *Runner) loop(ctx context.Context) {
	defer close(r.stopped)
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		case <-r.wake:
		}
		if _, err := r.FireDue(ctx); err != nil && ctx.Err() == nil {
			r.logger.WarnContext(ctx, "saga runner: firing timeouts", slog.Any("error", err))
		}
		timer.Reset(r.sleep(ctx))
	}
}

// sleep is how long to wait before the next look: until the earliest
// pending timeout is due, at most Poll. One that is due already was left
// locked by an event's step or is waiting out a retry: it gets the full
// Poll, so a busy instance does not turn the loop into a spin.
func (r *Runner) sleep(ctx context.Context) time.Duration {
	wait := r.cfg.Poll
	for _, s := range r.cfg.Sagas {
		next, err := s.nextDue(ctx, r.cfg.Store, r.q)
		if err != nil || next.IsZero() {
			continue
		}
		if until := next.Sub(s.Now()); until > 0 {
			wait = min(wait, until)
		}
	}
	return wait
}
