package projection

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/projectorhq/projector/internal/tracing"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/stores/postgres"
)

// EnvInstanceID names the variable a dispatcher takes its instance id from
// when its config has none.
const EnvInstanceID = "PROJECTOR_INSTANCE_ID"

// Defaults of [Config].
const (
	DefaultPollMin      = 2 * time.Millisecond
	DefaultPollMax      = 250 * time.Millisecond
	DefaultRecheck      = time.Second
	DefaultConcurrency  = 4
	DefaultMetricsEvery = 10 * time.Second
	// DefaultHeartbeatEvery is how often a dispatcher records that its
	// instance is alive.
	DefaultHeartbeatEvery = 10 * time.Second
	// DefaultInstanceExpiry is how long an instance may go unseen before its
	// per-instance shards stop holding retention back.
	DefaultInstanceExpiry = 24 * time.Hour
)

// Bounds of [Config.HeartbeatEvery] and [Config.InstanceExpiry].
const (
	MinHeartbeatEvery = 100 * time.Millisecond
	MaxHeartbeatEvery = 5 * time.Minute
	// MinExpiryHeartbeats: an instance expiry shorter than this many
	// heartbeats would let a slow but running instance's shards go stale.
	MinExpiryHeartbeats = 10
	MaxInstanceExpiry   = 366 * 24 * time.Hour
)

// Bounds of the other durations and of the concurrency of [Config]. A poll
// or recheck below a millisecond would spin on the database; a negative
// concurrency cannot size the pass semaphore.
const (
	MinPoll         = time.Millisecond
	MaxPoll         = time.Hour
	MinMetricsEvery = 10 * time.Millisecond
	MaxMetricsEvery = 24 * time.Hour
	MaxConcurrency  = 1024
)

// ErrInvalidConfig is wrapped by [New]'s errors for a [Config] field out of
// its range, so a caller that builds the config from flags or a file can
// tell a user's mistake from a failure to start.
var ErrInvalidConfig = errors.New("projection dispatcher: invalid configuration")

// ErrNotStarted is returned by [Dispatcher.CatchUp] on a dispatcher that was
// never started: nothing would ever move its shards, so waiting for them
// would never end.
var ErrNotStarted = errors.New("projection dispatcher: not started")

// Config configures a [Dispatcher]. Store and Projections are required.
type Config struct {
	Store       *postgres.Store
	Projections []*Async
	// InstanceID identifies this process among the fleet: per-instance
	// consumers keep one shard per instance id. Default $PROJECTOR_INSTANCE_ID,
	// else a random UUID (whose per-instance shards are then removed at a
	// graceful stop, since no later process can resume them).
	InstanceID string
	// Logger receives the dispatcher's log lines; default slog.Default().
	Logger *slog.Logger
	// Registerer receives the dispatcher's metrics; nil means no metrics.
	Registerer prometheus.Registerer
	// PollMin and PollMax bound the adaptive poll of the log head that wakes
	// caught-up shards: PollMin while events keep arriving, doubling up to
	// PollMax while nothing does. Defaults [DefaultPollMin], [DefaultPollMax]
	// (or PollMin, if larger); both between [MinPoll] and [MaxPoll], PollMax
	// at least PollMin.
	PollMin, PollMax time.Duration
	// Recheck is how often a shard that is not running here (locked by
	// another process, dead, disabled) looks at its state again; default
	// [DefaultRecheck]; between [MinPoll] and [MaxPoll].
	Recheck time.Duration
	// Concurrency caps the passes running at once (each holds a connection;
	// a pass catching up also reads its next batch on a second one, only
	// when the pool has one idle); default [DefaultConcurrency]; at most
	// [MaxConcurrency].
	Concurrency int
	// MetricsEvery is how often lag gauges are refreshed; default
	// [DefaultMetricsEvery]; between [MinMetricsEvery] and [MaxMetricsEvery].
	MetricsEvery time.Duration
	// HeartbeatEvery is how often the dispatcher records in
	// projector_instances that its instance is alive (riding on the log
	// probe), which is how `status` tells a shard a live dispatcher holds
	// from an unattended one. Default [DefaultHeartbeatEvery]; between
	// [MinHeartbeatEvery] and [MaxHeartbeatEvery].
	HeartbeatEvery time.Duration
	// InstanceExpiry is how long this instance may go unseen (killed,
	// scaled away, renamed) before its per-instance shards stop holding
	// retention back: a random instance id's are then removed by the next
	// prune, a fixed id's are kept but halted if a prune deletes events they
	// had not applied. Default [DefaultInstanceExpiry]; at least
	// [MinExpiryHeartbeats] heartbeats, at most [MaxInstanceExpiry].
	InstanceExpiry time.Duration
	// SeparateReads makes every shard read each batch of the log itself.
	// By default, shards of this dispatcher that stand at the same position
	// with the same event types and batch size (many consumers catching up
	// on one backlog) read a full batch once and each apply it in its own
	// transaction; this keeps up to two batches per shard in memory. Set it
	// to compare, or to bound memory with very large batches.
	SeparateReads bool
	// TracerProvider records one span per batch, linked to the spans that
	// appended its events (docs/tracing.md); default
	// otel.GetTracerProvider(), which does nothing until the application
	// installs an SDK.
	TracerProvider trace.TracerProvider
	// EventSpans adds a child span of the batch span per event a per-event
	// handler (OnEvent) handles, linked to the event's append: useful to see
	// which event of a batch took the time, and a span per event to pay
	// for. Off by default; never for batch handlers (OnBatch), nor in a
	// replay (a rebuild), nor when the batch span does not record.
	EventSpans bool
}

// validate checks every duration and count of cfg, defaults applied,
// against its bounds: each error names the field, its value and the range.
func (cfg Config) validate() error {
	within := func(field string, v, lo, hi time.Duration) error {
		if v < lo || v > hi {
			return fmt.Errorf("%w: Config.%s %v: want between %v and %v", ErrInvalidConfig, field, v, lo, hi)
		}
		return nil
	}
	errs := []error{
		within("PollMin", cfg.PollMin, MinPoll, MaxPoll),
		within("PollMax", cfg.PollMax, max(MinPoll, cfg.PollMin), MaxPoll),
		within("Recheck", cfg.Recheck, MinPoll, MaxPoll),
		within("MetricsEvery", cfg.MetricsEvery, MinMetricsEvery, MaxMetricsEvery),
		within("HeartbeatEvery", cfg.HeartbeatEvery, MinHeartbeatEvery, MaxHeartbeatEvery),
	}
	if cfg.Concurrency < 1 || cfg.Concurrency > MaxConcurrency {
		errs = append(errs, fmt.Errorf("%w: Config.Concurrency %d: want between 1 and %d", ErrInvalidConfig, cfg.Concurrency, MaxConcurrency))
	}
	if minExpiry := MinExpiryHeartbeats * cfg.HeartbeatEvery; cfg.InstanceExpiry < minExpiry || cfg.InstanceExpiry > MaxInstanceExpiry {
		errs = append(errs, fmt.Errorf("%w: Config.InstanceExpiry %v: want between %v (%d heartbeats) and %v",
			ErrInvalidConfig, cfg.InstanceExpiry, minExpiry, MinExpiryHeartbeats, MaxInstanceExpiry))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("projection dispatcher: %w", err)
	}
	return nil
}

// Dispatcher is the daemon that applies async projections: one loop per
// consumer shard, each pass one transaction that takes the shard's advisory
// lock (skipping a shard another process holds), reads the next batch with
// the gap-safe log read,
// runs the handlers and advances the cursor. See the package documentation
// for the guarantees.
type Dispatcher struct {
	store    *postgres.Store
	admin    *Admin
	cfg      Config
	instance string
	randomID bool
	// shards are the shards this dispatcher runs; a partitioned
	// consumer's change with its layout (syncLayout), so they are read
	// through allShards.
	shards   []*shard
	shardsMu sync.Mutex
	// soft and hard are the loops' contexts once Start ran (see Start),
	// for the loops of partitions a split or merge creates.
	soft, hard context.Context
	logger     *slog.Logger
	metrics    *metrics
	tracer     trace.Tracer
	sql        dispatchSQL
	park       parkSQL
	isql       instanceSQL
	psql       partitionSQL
	bsql       balanceSQL
	// balancers balance each partitioned consumer's partitions over the
	// processes that run it (balance.go).
	balancers  []*balancer
	sem        chan struct{}
	wake       broadcast
	mu         sync.Mutex
	started    bool
	stopping   bool
	softCancel context.CancelFunc
	hardCancel context.CancelFunc
	wg         sync.WaitGroup
	stopped    chan struct{}
	// shared shares full batch reads among shards; nil when off or when
	// no two shards read the same filter.
	shared *sharedReads
	// remeasure asks the metrics loop for a refresh now: a shard whose
	// published lag is not zero has caught up, so that lag may be stale.
	remeasure chan struct{}
	// relayout asks the balancing loop for a round now: a partitioned
	// consumer's layout changed (layoutnotify.go).
	relayout chan struct{}
	// retryKick asks the retry loop to look for retry requests now: one
	// was committed (layoutnotify.go).
	retryKick chan struct{}
	// waiting, when set (by tests), is told each time a shard's loop
	// starts to wait after a pass that left it with kind.
	waiting func(ShardID, passKind)
	// listened, when set (by tests), is called each time the dispatcher
	// starts listening for layout changes and shard wakes.
	listened func()
	// rounds, when set (by tests), is told of each step of the balancing
	// loop (roundStage) with the partitions it concerns.
	rounds func(consumer string, stage roundStage, ids []string)
}

// shard is one consumer shard run by this dispatcher.
type shard struct {
	id      ShardID
	proj    *Async
	lockKey string // see shardLockKey
	// gateKey is a partition's consumer's layout gate (gateLockKey), which
	// its passes take shared; empty for any other shard.
	gateKey string
	// limit, when not zero, caps the next batch below BatchSize: after a
	// batch timeout, the events that finished within the deadline. Only
	// the shard's own loop touches it.
	limit int
	// shadow is set on the shadow shard of a blue/green rebuild.
	shadow *shadow
	// ramped is set once a shadow shard's loop has cut its first batch
	// down to firstShadowBatch; ramping while its limit doubles from there
	// (grow), until a full batch or a timeout's cut.
	ramped, ramping bool
	// warnedVersion is the live model version last warned about (see
	// superseded).
	warnedVersion int
	// prefetch is the read of the next batch taken while the last pass
	// applied its own, or nil. Only the shard's own loop touches it.
	prefetch *prefetch
	// prefetched counts the batches a pass took from a prefetch.
	prefetched int
	// halves are the shards of a partition's halves, made by a pass that
	// is to split it (prefetchHalves), each with the read of its first
	// batch under way; nil otherwise. Only the shard's own loop touches it.
	halves []*shard
	// holdBusy: the merge try is to be made again soon (its sibling at
	// the hold, its lock taken; or, for an upper half just arrived, not
	// seen there), since holdBusySince (mergehandoff.go). Loop-owned.
	holdBusy      bool
	holdBusySince time.Time
	crossedHold   bool // the last pass crossed a hold it had not seen (holdcheck.go)
	// spanName is the name of the shard's batch spans (batchSpanName).
	spanName string
	// segment is a partition's hash segment; zero for an unpartitioned
	// shard. balancer says whether this process works it.
	segment  postgres.Segment
	balancer *balancer
	// planFrom is when a partition's passes start planning its neighbouring
	// reads (readplan.go): not in the first moments of a partition a split
	// or merge just made, when the change's own passes need the server.
	planFrom time.Time
	// kick wakes the loop: this process took the partition, it was split or
	// merged away, or a shard wake (WakeShards) names it.
	kick    chan struct{}
	removed atomic.Bool // split or merged away: its loop ends
	// standing: an upper half standing at its merge hold, which the
	// balancing round's wakes pass by (lowerLooks, mergehandoff.go).
	standing atomic.Bool
}

// readKey is the shard's log filter for shared reads: its event types and,
// for a partition, its segment.
func (sh *shard) readKey() string {
	k := filterKey(sh.proj.t.types)
	if seg := sh.readSegment(); seg.Bits > 0 {
		k += "\x01" + seg.String()
	}
	return k
}

// firstShadowBatch is the size of a shadow shard's first batch, from which
// its batches grow to RebuildBatchSize.
const firstShadowBatch = 100

// shadowApplicationName is the application_name of a shadow pass of
// consumer: "projector rebuild NAME", cut to PostgreSQL's 63 bytes.
func shadowApplicationName(consumer string) string {
	name := "projector rebuild " + consumer
	if len(name) > 63 {
		name = name[:63]
	}
	return name
}

// batchLimit is how many events the shard's next pass reads.
func (sh *shard) batchLimit(batchSize int) int {
	if sh.limit > 0 && sh.limit < batchSize {
		return sh.limit
	}
	return batchSize
}

// grow raises the shard's limit after a committed batch: doubled while a
// shadow shard ramps up from its first batch, else as growLimit says.
func (sh *shard) grow(batchSize int) {
	if !sh.ramping {
		sh.growLimit(batchSize)
		return
	}
	if sh.limit *= 2; sh.limit >= batchSize {
		sh.limit, sh.ramping = 0, false
	}
}

// growLimit lets a batch cut short by a timeout grow back towards
// batchSize, by a quarter a pass: a handler that slowed down for a while
// gets its full batches back, one that is always slow settles just below
// the size that times out.
func (sh *shard) growLimit(batchSize int) {
	if sh.limit == 0 {
		return
	}
	sh.limit += max(1, sh.limit/4)
	if sh.limit >= batchSize {
		sh.limit = 0
	}
}

// waitShardLockSQL takes a shard's advisory lock (see shardLockKey),
// waiting for a running pass: what operator transitions and out-of-band
// failure records do before touching a shard.
const waitShardLockSQL = `SELECT pg_advisory_xact_lock(hashtextextended($1::text, 0))`

// shardLockKey names a shard's advisory lock: hashed to 64 bits in the
// database, keyed on the schema so side-by-side schemas never contend.
// The prune in stores/postgres builds the same key in SQL (tryShardLock) to
// pass over an expired shard only while no pass runs it: change both.
func shardLockKey(schema string, id ShardID) string {
	return "projector.shard\x1f" + schema + "\x1f" + id.Consumer + "\x1f" + id.Instance
}

// New validates the configuration and the projections against the store's
// registry and returns a dispatcher ready to Start.
func New(cfg Config) (*Dispatcher, error) {
	if cfg.Store == nil {
		return nil, errors.New("projection dispatcher: Config.Store is required")
	}
	if len(cfg.Projections) == 0 {
		return nil, errors.New("projection dispatcher: no projections")
	}
	cfg.PollMin = cmp.Or(cfg.PollMin, DefaultPollMin)
	cfg.PollMax = cmp.Or(cfg.PollMax, max(DefaultPollMax, cfg.PollMin))
	cfg.Recheck = cmp.Or(cfg.Recheck, DefaultRecheck)
	cfg.Concurrency = cmp.Or(cfg.Concurrency, DefaultConcurrency)
	cfg.MetricsEvery = cmp.Or(cfg.MetricsEvery, DefaultMetricsEvery)
	cfg.HeartbeatEvery = cmp.Or(cfg.HeartbeatEvery, DefaultHeartbeatEvery)
	cfg.InstanceExpiry = cmp.Or(cfg.InstanceExpiry, DefaultInstanceExpiry)
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	d := &Dispatcher{
		store:   cfg.Store,
		admin:   NewAdmin(cfg.Store),
		cfg:     cfg,
		logger:  cmp.Or(cfg.Logger, slog.Default()),
		sql:     buildDispatchSQL(cfg.Store),
		park:    buildParkSQL(cfg.Store),
		isql:    buildInstanceSQL(cfg.Store),
		psql:    buildPartitionSQL(cfg.Store),
		bsql:    buildBalanceSQL(cfg.Store),
		sem:     make(chan struct{}, cfg.Concurrency),
		stopped: make(chan struct{}),

		remeasure: make(chan struct{}, 1),
		relayout:  make(chan struct{}, 1),
		retryKick: make(chan struct{}, 1),
	}
	d.tracer = tracing.Tracer(cfg.TracerProvider)
	d.instance = cmp.Or(cfg.InstanceID, os.Getenv(EnvInstanceID))
	if d.instance == "" {
		d.instance, d.randomID = uuid.NewString(), true
	}
	if d.instance == SharedInstance || d.instance == RebuildInstance || strings.HasPrefix(d.instance, PartitionPrefix) {
		return nil, fmt.Errorf("%w: instance id %s is reserved; choose another (%s)", ErrInvalidConfig, projector.Quoted(d.instance), EnvInstanceID)
	}
	if err := validInstance(d.instance); err != nil {
		return nil, fmt.Errorf("%w: %w (Config.InstanceID or %s)", ErrInvalidConfig, err, EnvInstanceID)
	}
	seen := map[string]bool{}
	for _, p := range cfg.Projections {
		if p == nil {
			return nil, errors.New("projection dispatcher: nil projection")
		}
		if seen[p.name] {
			return nil, fmt.Errorf("%w: projection %q registered twice", ErrInvalidDefinition, p.name)
		}
		seen[p.name] = true
		if err := p.Validate(cfg.Store.Registry()); err != nil {
			return nil, err
		}
		if n := p.cfg.Partitions; n > 1 {
			// The declared partitions, until Start reads the layout the
			// consumer has (register): live splits and merges change it.
			b := newBalancer(p)
			ids := make([]string, n)
			for i := range n {
				ids[i] = PartitionInstance(i, n)
			}
			d.syncLayout(b, ids, time.Time{})
			d.balancers = append(d.balancers, b)
			continue
		}
		id := ShardID{Consumer: p.name, Instance: SharedInstance}
		if p.cfg.Delivery == PerInstance {
			id.Instance = d.instance
		}
		d.shards = append(d.shards, &shard{id: id, proj: p, lockKey: shardLockKey(cfg.Store.Schema(), id), kick: make(chan struct{}, 1)})
	}
	if len(d.balancers) > 0 {
		// A process that dies is passed over once it misses LiveHeartbeats
		// heartbeats: partitions are taken over within seconds.
		d.cfg.HeartbeatEvery = min(d.cfg.HeartbeatEvery, PartitionHeartbeatEvery)
	}
	if !cfg.SeparateReads {
		keys := make([]string, len(d.shards))
		for i, sh := range d.shards {
			keys[i] = sh.readKey()
		}
		d.shared = newSharedReads(keys)
	}
	if cfg.Registerer != nil {
		m, err := newMetrics(cfg.Registerer)
		if err != nil {
			return nil, fmt.Errorf("projection dispatcher: metrics: %w", err)
		}
		d.metrics = m
	}
	return d, nil
}

// allShards returns the shards this dispatcher runs now.
func (d *Dispatcher) allShards() []*shard {
	d.shardsMu.Lock()
	defer d.shardsMu.Unlock()
	return slices.Clone(d.shards)
}

// replaceShards adds and removes shards (a partitioned consumer's layout
// changed), starting the loops of those added once the dispatcher runs.
// The removed ones end their loops themselves (shard.removed).
func (d *Dispatcher) replaceShards(added, removed []*shard) {
	d.shardsMu.Lock()
	defer d.shardsMu.Unlock()
	d.shards = slices.DeleteFunc(d.shards, func(sh *shard) bool { return slices.Contains(removed, sh) })
	d.shards = append(d.shards, added...)
	if d.metrics != nil && d.soft != nil {
		for _, sh := range removed {
			d.metrics.forget(sh.id)
		}
	}
	if d.soft == nil || d.soft.Err() != nil {
		return // Start spawns them, or the dispatcher is stopping
	}
	for _, sh := range added {
		if d.metrics != nil {
			d.metrics.start(sh.id)
		}
		soft, hard := d.soft, d.hard
		d.wg.Go(func() { d.runShard(soft, hard, sh) })
	}
}

// InstanceID returns this dispatcher's instance id.
func (d *Dispatcher) InstanceID() string { return d.instance }

// Shards returns the shards this dispatcher runs.
func (d *Dispatcher) Shards() []ShardID {
	shards := d.allShards()
	out := make([]ShardID, len(shards))
	for i, s := range shards {
		out[i] = s.id
	}
	return out
}

// Start registers every shard's state row (before any pass, so retention
// sees every consumer) and starts the loops. It returns once they run;
// cancelling ctx stops the dispatcher as Stop does. A second Start is a
// no-op; a Start after Stop is an error.
func (d *Dispatcher) Start(ctx context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.started {
		if d.stopping {
			return errors.New("projection dispatcher: already stopped; build a new one")
		}
		return nil
	}
	if d.needsPartitionIndex() {
		// Without the index every partition's read would walk the log.
		if err := d.store.CheckPartitionIndex(ctx); err != nil {
			return fmt.Errorf("projection dispatcher: %w", err)
		}
	}
	if err := d.register(ctx); err != nil {
		return err
	}
	if err := d.registerProjections(ctx); err != nil {
		return err
	}
	d.started = true
	if d.metrics != nil {
		for _, sh := range d.shards {
			d.metrics.start(sh.id)
		}
	}
	soft, softCancel := context.WithCancel(ctx)
	hard, hardCancel := context.WithCancel(context.WithoutCancel(ctx))
	d.softCancel, d.hardCancel = softCancel, hardCancel

	d.wg.Go(func() { d.probeLoop(soft) })
	d.wg.Go(func() { d.rebuildLoop(soft, hard) })
	d.wg.Go(func() { d.retryLoop(soft) })      // dead-letter retry requests (deadletter.go)
	d.wg.Go(func() { d.balanceLoop(soft) })    // partitions (balance.go)
	d.wg.Go(func() { d.planLoop(soft, hard) }) // their neighbouring reads (readplan.go)
	d.wg.Go(func() { d.layoutListenLoop(soft) })
	if d.metrics != nil {
		d.wg.Go(func() { d.metricsLoop(soft) })
	}
	d.shardsMu.Lock()
	d.soft, d.hard = soft, hard
	for _, sh := range d.shards {
		d.wg.Go(func() { d.runShard(soft, hard, sh) })
	}
	d.shardsMu.Unlock()
	go func() {
		d.wg.Wait()
		d.cleanup()
		d.logStopped(hard.Err() != nil) // before Stopped closes: a test's logger must not outlive it
		hardCancel()
		close(d.stopped)
	}()
	d.logStarted(ctx)
	return nil
}

// Stop lets each shard finish the batch it is applying, then stops. If ctx
// ends first, running batches are cancelled and roll back (nothing is lost:
// they are applied again later). Safe to call twice, and before Start.
func (d *Dispatcher) Stop(ctx context.Context) error {
	d.mu.Lock()
	if !d.started {
		d.started, d.stopping = true, true
		close(d.stopped)
		d.mu.Unlock()
		return nil
	}
	d.stopping = true
	d.softCancel()
	d.mu.Unlock()
	select {
	case <-d.stopped:
		return nil
	case <-ctx.Done():
		d.hardCancel()
		<-d.stopped
		return fmt.Errorf("projection dispatcher: stop: %w; running batches were rolled back", ctx.Err())
	}
}

// Stopped is closed once the dispatcher has stopped.
func (d *Dispatcher) Stopped() <-chan struct{} { return d.stopped }

// runShard is one shard's loop: pass after pass while there is work, then
// wait for a wake-up, a retry time or a recheck.
func (d *Dispatcher) runShard(soft, hard context.Context, sh *shard) {
	log := d.logger.With(slog.String("consumer", sh.id.Consumer), slog.String("instance_id", sh.id.Instance))
	dbFailures := 0
	for {
		// Take the wake channel before the pass so a wake-up that arrives
		// during it is not lost.
		woken := d.wake.wait()
		select {
		case d.sem <- struct{}{}:
		case <-soft.Done():
			return
		}
		res, err := d.pass(hard, sh)
		res, err = sh.againPastHold(soft, log, res, err)
		<-d.sem
		if soft.Err() != nil {
			return
		}
		sh.standing.Store(err == nil && res.kind == passAtHold && upperHalf(sh))
		if res.held && res.kind != passGone && sh.balancer != nil && !sh.balancer.owns(sh.id.Instance) {
			// The partition was released (or taken) while this pass held
			// its lock: its new owner's pass may have found the lock taken
			// and be waiting a Recheck. The lock is free now: wake it.
			if err := WakeShards(hard, d.store, sh.id); err != nil {
				log.DebugContext(soft, "projection dispatcher: wake the partition's new owner", slog.Any("error", err))
			}
		}

		var wait time.Duration
		wake := true
		switch {
		case err != nil:
			if d.metrics != nil && errors.As(err, new(*conflictError)) {
				d.metrics.conflict(sh.id)
			}
			dbFailures++
			wait = dbBackoff(dbFailures)
			wake = false
			log.WarnContext(soft, "projection dispatcher: pass failed; retrying", slog.Any("error", err), slog.Duration("retry_in", wait))
		case res.kind == passMore:
			dbFailures = 0
			continue
		case res.kind == passGone:
			return
		case res.kind == passCaughtUp:
			dbFailures = 0
			wait = d.cfg.Recheck
			if d.metrics != nil && d.metrics.lagging(sh.id) {
				// The gauge still shows the lag measured before this
				// catch-up: measure again rather than report it for a
				// whole period.
				select {
				case d.remeasure <- struct{}{}:
				default: // one is pending already
				}
			}
		case res.kind == passRetryAt:
			dbFailures = 0
			wait, wake = time.Until(res.retryAt), false
		case res.kind == passNotMine:
			dbFailures = 0
			wait, wake = d.cfg.Recheck, false
		default: // locked elsewhere, dead, disabled: until a shard wake (layoutnotify.go) or Recheck
			dbFailures = 0
			wait, wake = d.cfg.Recheck, false
		}
		if wait <= 0 {
			continue
		}
		timer := time.NewTimer(wait)
		if !wake {
			woken = nil
		}
		kick := sh.kick
		if res.quiet {
			kick = nil // looking again at a merge hold (holdRetry)
		}
		if d.waiting != nil && err == nil {
			d.waiting(sh.id, res.kind)
		}
		select {
		case <-soft.Done():
			timer.Stop()
			return
		case <-woken:
		case <-kick: // this process took the partition, or a shard wake (layoutnotify.go)
		case <-timer.C:
		}
		timer.Stop()
	}
}

// Bounds of the hinted poll: after an append through this dispatcher's
// own Store (postgres.Store.WatchAppends), the probe looks every
// hintedPoll, hintedSteady times, then at doubling intervals up to
// hintedPollMax, until the horizon has passed that transaction. The
// append's commit usually follows within a few milliseconds; a transaction
// that stays open (or a horizon another session holds back) then costs at
// most one probe per hintedPollMax.
const (
	hintedPoll    = time.Millisecond
	hintedSteady  = 16
	hintedPollMax = 64 * time.Millisecond
)

// probeLoop polls the log head and wakes the shards when what a reader can
// be handed has moved: new events below the horizon, or held events released
// by a transaction ending. Adaptive: PollMin while things move, doubling to
// PollMax while they do not. The figures behind this choice over
// LISTEN/NOTIFY are in docs/performance.md.
//
// Appends through the dispatcher's own Store (the same process) are
// hinted: the probe then looks every millisecond for a while, then at
// doubling intervals up to hintedPollMax, until the horizon has passed the
// appending transaction, so such an event is handed on about a millisecond
// after its commit instead of up to PollMin later. An idle dispatcher polls
// exactly as without hints, and the append path gains no statement.
//
// The loop also carries the instance's heartbeat, a statement of its own
// every HeartbeatEvery: the probe is read-only and runs far more often.
func (d *Dispatcher) probeLoop(ctx context.Context) {
	hints := d.store.WatchAppends()
	defer hints.Close()
	interval := d.cfg.PollMin
	var last projector.Position
	timer := time.NewTimer(0)
	defer timer.Stop()
	next := time.Now()
	var hinted uint64 // newest hinted transaction the horizon has not passed
	hintedNext, hintedLooks := hintedPoll, 0
	lastBeat := time.Now() // register wrote the first
	for {
		select {
		case <-ctx.Done():
			return
		case <-hints.C():
			hinted = max(hinted, hints.Take())
			hintedNext, hintedLooks = hintedPoll, 0
			// Its commit has not happened yet: look shortly, not at once,
			// and never later than already planned.
			if at := time.Now().Add(hintedPoll); at.Before(next) {
				next = at
				timer.Reset(hintedPoll)
			}
			continue
		case <-timer.C:
		}
		if time.Since(lastBeat) >= d.cfg.HeartbeatEvery {
			if err := d.heartbeat(ctx, d.store.Pool(), false); err != nil {
				if ctx.Err() == nil {
					d.logger.WarnContext(ctx, "projection dispatcher: heartbeat failed; will retry", slog.Any("error", err))
				}
			} else {
				lastBeat = time.Now()
			}
		}
		pos, xmin, err := d.deliverable(ctx)
		switch {
		case err != nil:
			interval = d.cfg.PollMax
		case pos != last:
			last = pos
			d.wake.broadcast()
			interval = d.cfg.PollMin
		default:
			interval = min(interval*2, d.cfg.PollMax)
		}
		if hinted != 0 {
			if err == nil && xmin > hinted {
				hinted = 0 // ended, and handed on above if it committed
			} else {
				interval = min(interval, hintedNext)
				if hintedLooks++; hintedLooks >= hintedSteady {
					hintedNext = min(2*hintedNext, hintedPollMax)
				}
			}
		}
		next = time.Now().Add(interval)
		timer.Reset(interval)
	}
}

// deliverable returns the newest position a reader could be handed now: the
// newest visible event, or the horizon if that is older; and the horizon's
// transaction id (every transaction below it has ended).
func (d *Dispatcher) deliverable(ctx context.Context) (projector.Position, uint64, error) {
	head, xmin, err := d.head(ctx)
	if err != nil {
		return projector.Position{}, 0, err
	}
	if h := projector.Horizon(xmin); h.Less(head) {
		return h, xmin, nil
	}
	return head, xmin, nil
}

// head returns the newest committed event's position (every committed event
// sorts at or before it) and the current horizon.
func (d *Dispatcher) head(ctx context.Context) (projector.Position, uint64, error) {
	var txID *uint64
	var seq *int64
	var xmin uint64
	if err := d.store.Pool().QueryRow(ctx, d.sql.probe).Scan(&txID, &seq, &xmin); err != nil {
		return projector.Position{}, 0, err
	}
	if txID == nil {
		return projector.Start, xmin, nil
	}
	return projector.Position{TxID: *txID, Seq: *seq}, xmin, nil
}
