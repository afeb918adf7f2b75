package projection

import (
	"cmp"
	"context"
	"fmt"
	"regexp"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
)

// Delivery says which processes apply a consumer's events.
type Delivery int

const (
	// Shared: every event is applied once in total, by whichever process
	// holds the consumer's one shard. The default.
	Shared Delivery = iota
	// PerInstance: every process applies every event, each with its own
	// shard and cursor (in-memory caches, live counters, local fan-out).
	PerInstance
)

// String renders the delivery for logs and status output.
func (d Delivery) String() string {
	if d == PerInstance {
		return "per-instance"
	}
	return "shared"
}

// ErrorMode says what a handler error does to a shard.
type ErrorMode int

const (
	// HaltOnError retries the failing event with exponential backoff and,
	// after MaxAttempts, marks the shard dead until an operator acts. Events
	// before the failing one are committed; nothing after it is applied.
	// The default.
	HaltOnError ErrorMode = iota
	// SkipApplyErrors is continuous mode: the failing event's effects are
	// rolled back, the event goes to the dead-letter table and the shard
	// goes on with the next one.
	SkipApplyErrors
	// ParkStream parks the failing event's stream instead of stopping the
	// shard: after MaxAttempts (retried with backoff, as in halt mode) the
	// event goes to the park table (projector_parks), and every later event
	// of its stream the consumer reads goes there behind it, in order,
	// without reaching the handler. Other streams go on, and the cursor
	// moves past the parked events (`events prune` keeps them while they are
	// parked). An operator retries the parked sequence through the current
	// handlers ([RetryPark], `projector parked retry`), which makes the
	// stream live again, or discards it ([DiscardPark]). A stream's events
	// are applied in version order or not at all (promise 18). A systemic
	// failure ([IsSystemic]) or a batch timeout still stops the shard: they
	// are not about one stream.
	ParkStream
)

// String renders the mode for logs and status output.
func (m ErrorMode) String() string {
	switch m {
	case SkipApplyErrors:
		return "skip-apply-errors"
	case ParkStream:
		return "park-stream"
	}
	return "halt-on-error"
}

// StartFrom says where a consumer seen for the first time starts reading.
type StartFrom int

const (
	// FromBeginning replays the whole log. The default.
	FromBeginning StartFrom = iota
	// FromNow starts at the log's horizon when the consumer is first
	// registered: after every transaction that had finished by then. Events
	// of transactions still running are delivered, so a transaction that
	// held the horizon back may also bring a few that committed just before.
	FromNow
)

// Defaults of [AsyncConfig].
const (
	DefaultBatchSize    = 500
	DefaultMaxAttempts  = 10
	DefaultRetryBackoff = time.Second
	DefaultMaxBackoff   = 5 * time.Minute
	DefaultBatchTimeout = time.Minute
	// DefaultRebuildBatchFactor sizes a rebuild's shadow batches: this many
	// times BatchSize (at most [MaxBatchSize]) unless
	// [AsyncConfig.RebuildBatchSize] says otherwise. docs/performance.md has
	// the measurements it comes from.
	DefaultRebuildBatchFactor = 10
	// MaxBatchSize bounds BatchSize and RebuildBatchSize.
	MaxBatchSize = 100_000
)

// AsyncConfig configures an async projection. The zero value is a shared,
// halt-on-error consumer that starts from the beginning of the log.
type AsyncConfig struct {
	Delivery  Delivery
	ErrorMode ErrorMode
	StartFrom StartFrom
	// BatchSize caps the events applied in one transaction; default
	// [DefaultBatchSize].
	BatchSize int
	// RebuildBatchSize caps the events a blue/green rebuild's shadow pass
	// applies in one transaction; default [DefaultRebuildBatchFactor] times
	// BatchSize, at most [MaxBatchSize]. A shadow pass writes tables no
	// reader uses yet, so nothing waits for its commit: larger batches cost
	// no freshness and save a cursor update and a commit per batch, and a
	// batch handler folds more events into each row it writes. A batch
	// that outlasts BatchTimeout is cut down as live ones are.
	RebuildBatchSize int
	// MaxAttempts is how many times a failing event is tried before the
	// shard goes dead (halt mode) or its stream is parked ([ParkStream]);
	// default [DefaultMaxAttempts].
	MaxAttempts int
	// RetryBackoff is the wait after the first failure, doubled after each
	// further one up to MaxBackoff; defaults [DefaultRetryBackoff] and
	// [DefaultMaxBackoff]. A random ±20% is added so shards failing together
	// do not retry together.
	RetryBackoff time.Duration
	MaxBackoff   time.Duration
	// BatchTimeout bounds how long the handlers of one batch may run; past
	// it their context is cancelled and the batch fails like any handler
	// error (retried with backoff, dead after MaxAttempts). A pass that has
	// written holds back delivery for every consumer in the cluster until it
	// commits, so a hung handler must not run forever. Default
	// [DefaultBatchTimeout].
	BatchTimeout time.Duration
	// RawPayloads skips decoding payloads: handlers get ev.Data (upcast
	// JSON) and a nil ev.Payload. For batch and untyped handlers that write
	// the JSON straight to SQL or only need the envelope, it saves the
	// decoding, a sixth of a busy dispatcher's CPU. Typed handlers ([On])
	// need payloads, so the two do not mix.
	RawPayloads bool
	// AfterCommit, when set, is called with the events of every batch the
	// shard applied, right after the batch's transaction committed: the
	// place for in-memory state that must only ever reflect committed work
	// (a live counter on a per-instance consumer, a push to connected
	// clients). It runs on the shard's goroutine; keep it quick. Events a
	// continuous-mode shard dead-lettered are not included.
	AfterCommit func(events []projector.Event)
	// Version is the version of the read model the projection maintains,
	// default 1. Bump it when a handler changes what the tables hold; a
	// dispatcher runs the consumer only while the consumer's recorded
	// version matches, so during a rolling deploy old and new binaries never
	// write the same tables, and the new version is built by a rebuild
	// (docs/rebuilds.md). At most PartitionedVersion-1 (a PostgreSQL integer; the
	// largest marks a partitioned consumer).
	Version int
	// Tables are the read-model tables the projection owns, as its
	// handlers name them: "table" (resolved through the dispatcher
	// session's search_path when it starts) or "schema.table". A rebuild
	// clears them (in place) or builds copies of them (blue/green); without
	// them a projection cannot be rebuilt. Lower-case identifiers only.
	Tables []string
	// ScopeColumns and ResetScope say how to clear what one tenant or one
	// stream contributed, for a partial rebuild of that scope
	// (docs/rebuilds.md): columns of every declared table that a scope's
	// rows are deleted by, and a function for anything they do not cover.
	// Without either, a partial rebuild is refused.
	ScopeColumns ScopeColumns
	ResetScope   ResetScopeFunc
	// PrepareShadow, when set, gives a blue/green rebuild's shadow tables
	// this version's shape before the replay starts: they are created as
	// copies of the live tables, and a version that adds a column or an
	// index says so here (ALTER TABLE counts ADD COLUMN …, unqualified:
	// the transaction's search_path starts with the shadow schema). It runs
	// once per rebuild, in a dispatcher of this version, in a transaction
	// that records it done; an error is logged and the rebuild waits for the
	// next try.
	PrepareShadow func(ctx context.Context, tx pgx.Tx) error
	// Partitions spreads the consumer over this many shards, one per hash
	// segment of the streams (docs/scaling.md): each partition has its own
	// cursor, lock, status and dead letters, and partitions are applied in
	// parallel, in one process or balanced over every process running the
	// projection. A stream belongs to one partition, so its events keep
	// their order; events of different streams may be applied in any
	// order. 0 or 1: unpartitioned, exactly as before. Otherwise a power of
	// two up to postgres.MaxPartitions, for a shared consumer (search
	// projections included). It is the count a new consumer starts with; after
	// that the consumer's partitions are what operators make them live
	// ([Admin.Split], [Admin.Merge]). Raising it splits the partitions at
	// start; lowering it is refused at start (ErrPartitionsChanged, naming
	// the merge to run) unless the partitions already have the new count.
	Partitions int
	// PartitionKey, on a partitioned consumer, places each event by a key
	// of its own instead of by its stream: the event belongs to the
	// partition of KeyHash(tenant, consumer name, key), so the events of
	// many streams that share a key are applied by one partition, in log
	// order. Sagas set it to their correlation key. SQL cannot filter by a
	// key derived in Go, so each partition reads every event of the
	// consumer's types and keeps its own: with N partitions, N log rows
	// read and N payload decodes per event applied (docs/scaling.md). The
	// payload is decoded before the call (unless RawPayloads). An event
	// whose payload does not decode, or whose key fails, belongs to its
	// stream's partition, where its handler meets the failure. Such a
	// consumer needs no partition index.
	PartitionKey func(ev projector.Event) (string, error)
	// External, when set, is where the projection's model lives outside
	// PostgreSQL (a Meilisearch index: search.Projection sets it). It makes
	// the projection rebuildable blue/green without declared tables: the
	// rebuild builds a shadow of the target beside the live one and swaps
	// it in after the cursor moved (docs/search.md).
	External External
}

// Async is a projection applied by the dispatcher daemon after commit, in
// batches, each batch in one transaction together with the consumer's
// cursor. Register handlers with [On], [OnEvent] or [OnBatch], then hand it
// to a [Dispatcher].
type Async struct {
	name string
	cfg  AsyncConfig
	t    table
}

// NewAsync returns an async projection; zero fields of cfg take their
// documented defaults.
func NewAsync(name string, cfg AsyncConfig) *Async {
	cfg.BatchSize = cmp.Or(cfg.BatchSize, DefaultBatchSize)
	cfg.RebuildBatchSize = cmp.Or(cfg.RebuildBatchSize, min(DefaultRebuildBatchFactor*max(cfg.BatchSize, 1), MaxBatchSize))
	cfg.MaxAttempts = cmp.Or(cfg.MaxAttempts, DefaultMaxAttempts)
	cfg.RetryBackoff = cmp.Or(cfg.RetryBackoff, DefaultRetryBackoff)
	cfg.MaxBackoff = cmp.Or(cfg.MaxBackoff, DefaultMaxBackoff)
	cfg.BatchTimeout = cmp.Or(cfg.BatchTimeout, DefaultBatchTimeout)
	cfg.Version = cmp.Or(cfg.Version, 1)
	cfg.Tables = slices.Clone(cfg.Tables)
	p := &Async{name: name, cfg: cfg}
	switch {
	case cfg.Version < 1 || cfg.Version >= PartitionedVersion:
		// Stored as a PostgreSQL integer; the largest one marks a
		// partitioned consumer's fence row.
		p.t.fail(name, fmt.Errorf("version %d outside 1..%d", cfg.Version, PartitionedVersion-1))
	case cfg.StartFrom != FromBeginning && cfg.StartFrom != FromNow:
		p.t.fail(name, fmt.Errorf("unknown start %d (FromBeginning or FromNow)", cfg.StartFrom))
	case validTables(cfg.Tables) != nil:
		p.t.fail(name, validTables(cfg.Tables))
	case cfg.ScopeColumns.validate(cfg.Tables) != nil:
		p.t.fail(name, cfg.ScopeColumns.validate(cfg.Tables))
	case validName(name) != nil:
		p.t.fail(name, validName(name))
	case validPartitions(cfg) != nil:
		p.t.fail(name, validPartitions(cfg))
	case cfg.BatchSize < 1 || cfg.BatchSize > MaxBatchSize:
		p.t.fail(name, fmt.Errorf("batch size %d outside 1..%d", cfg.BatchSize, MaxBatchSize))
	case cfg.RebuildBatchSize < 1 || cfg.RebuildBatchSize > MaxBatchSize:
		p.t.fail(name, fmt.Errorf("rebuild batch size %d outside 1..%d", cfg.RebuildBatchSize, MaxBatchSize))
	case cfg.MaxAttempts < 1:
		p.t.fail(name, fmt.Errorf("max attempts %d below 1", cfg.MaxAttempts))
	case cfg.BatchTimeout < 0:
		p.t.fail(name, fmt.Errorf("batch timeout %v is negative", cfg.BatchTimeout))
	case cfg.RetryBackoff < 0 || cfg.MaxBackoff < cfg.RetryBackoff:
		p.t.fail(name, fmt.Errorf("retry backoff %v / max %v", cfg.RetryBackoff, cfg.MaxBackoff))
	case cfg.Delivery != Shared && cfg.Delivery != PerInstance:
		p.t.fail(name, fmt.Errorf("unknown delivery %d", cfg.Delivery))
	case cfg.ErrorMode != HaltOnError && cfg.ErrorMode != SkipApplyErrors && cfg.ErrorMode != ParkStream:
		p.t.fail(name, fmt.Errorf("unknown error mode %d", cfg.ErrorMode))
	}
	return p
}

// Name returns the projection's (and its consumer's) name.
func (p *Async) Name() string { return p.name }

// Config returns the projection's configuration with defaults filled in.
func (p *Async) Config() AsyncConfig { return p.cfg }

// EventTypes returns the handled event types in registration order.
func (p *Async) EventTypes() []string { return p.t.eventTypes() }

func (p *Async) handlers() *table { return &p.t }

// Validate reports a registration error, or a handled type reg does not
// define.
func (p *Async) Validate(reg *projector.Registry) error {
	if p.cfg.RawPayloads && p.t.typed {
		return fmt.Errorf("%w: projection %q: RawPayloads with typed handlers (On), which need decoded payloads; use OnEvent or OnBatch", ErrInvalidDefinition, p.name)
	}
	return p.t.validate(p.name, reg)
}

// backoff returns the wait before attempt n+1 after n failures.
func (p *Async) backoff(failures int, jitter float64) time.Duration {
	d := p.cfg.RetryBackoff
	for i := 1; i < failures && d < p.cfg.MaxBackoff; i++ {
		d *= 2
	}
	d = min(d, p.cfg.MaxBackoff)
	return time.Duration(float64(d) * (0.8 + 0.4*jitter))
}

// tablePattern is a declared table: a lower-case identifier, optionally
// schema-qualified, so it needs no quoting and names one relation.
var tablePattern = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}(\.[a-z_][a-z0-9_]{0,62})?$`)

func validTables(tables []string) error {
	seen := map[string]bool{}
	for _, t := range tables {
		if !tablePattern.MatchString(t) {
			return fmt.Errorf("table %q: want a lower-case identifier, optionally schema-qualified (schema.table)", t)
		}
		if seen[t] {
			return fmt.Errorf("table %q declared twice", t)
		}
		seen[t] = true
	}
	return nil
}
