package saga

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/aggregate"
	"github.com/projectorhq/projector/projection"
)

// Sentinel errors, for errors.Is.
var (
	// ErrInvalidDefinition: a saga was defined wrongly (a bad name, a
	// handler for an undefined event type, a type or timeout handled twice).
	// Returned at registration and again when the saga is bound to a store,
	// so an ignored registration error still stops the start.
	ErrInvalidDefinition = errors.New("saga: invalid definition")
	// ErrInvalidStep: a handler decided something that cannot be done (an
	// empty correlation key, a timeout in the past or of an unregistered
	// name, an appended payload of an undefined type). The step fails as a
	// whole and nothing of it is written.
	ErrInvalidStep = errors.New("saga: invalid step")
	// ErrInvalidArgument: an operation was given an argument it cannot use
	// (a negative age, an unknown status); nothing was done.
	ErrInvalidArgument = errors.New("saga: invalid argument")
)

// Status is an instance's lifecycle state.
type Status string

// Instance statuses.
const (
	// Active instances handle events and fire timeouts.
	Active Status = "active"
	// Completed instances ignore (and count) the events that still reach
	// them; their timeouts were cancelled when they completed.
	Completed Status = "completed"
	// Failed instances were stopped by a timeout handler that kept failing,
	// or by a failing step in continuous mode; like completed ones they
	// ignore and count later events. [Reactivate] makes one active again.
	Failed Status = "failed"
	// Parked instances (ParkStream) had a step fail MaxAttempts times: the
	// event and every later event of the instance wait in its park, in log
	// order; the instance keeps its state and its pending timeouts, which
	// do not fire until a retry of the park makes it active again.
	Parked Status = "parked"
)

// Defaults of [Config].
const (
	DefaultTimeoutAttempts = 10
	// DefaultRetryBackoff is the saga consumer's first retry wait, shorter
	// than a projection's: the common failure of a step is contention with
	// a timeout's step on the same stream, gone on the next try.
	DefaultRetryBackoff = 50 * time.Millisecond
)

// Config configures a saga type. The zero value is usable.
type Config struct {
	// Now is the saga's clock: handlers see it as [Instance.Now], timeouts
	// are scheduled and fired by it. Default time.Now; tests inject their
	// own to make hours pass in milliseconds.
	Now func() time.Time
	// Async configures the consumer the saga runs as. Delivery must be
	// shared (one instance must never be handled by two processes). The
	// error mode says what an event's failing step does:
	//
	//   - projection.HaltOnError (the default): it stops the saga's
	//     consumer until it is fixed, as a failing projection does.
	//   - projection.ParkStream: after MaxAttempts the instance is parked
	//     (keyed by its correlation key: [Parked]) and the consumer goes on;
	//     the instance's later events wait behind the failed one, in order,
	//     until `projector parked retry` (or `projector saga retry`) applies
	//     them all, or `parked discard` drops them. As in continuous mode,
	//     only a step's own failure parks; contention and database failures
	//     are retried, and an event whose correlation key cannot be taken
	//     (no instance to park) halts the consumer.
	//   - projection.SkipApplyErrors (continuous mode): the step is rolled
	//     back, the event goes to the dead-letter table under the saga's
	//     consumer, its instance is marked failed (its timeouts cancelled,
	//     later events ignored and counted as late) and the consumer goes
	//     on. Contention and database failures are still retried, never
	//     dead-lettered: the consumer itself runs halt-on-error, and only a
	//     step's own failure (a handler's error, an invalid step, a command
	//     refused by its aggregate) is skipped.
	Async projection.AsyncConfig
	// TimeoutAttempts is how many times a failing timeout handler is tried
	// (with backoff) before the instance is marked failed; default
	// [DefaultTimeoutAttempts].
	TimeoutAttempts int
	// Personal declares the state's personal fields and its data subject's
	// id field, by top-level JSON name, as an event type's TypeConfig does
	// for a payload: the saga stores those fields of an instance's state
	// sealed under the subject's key, never in the clear, and opens them
	// when it loads the instance, so forgetting the subject reaches them
	// too: after a forget they load as zero values and the instance keeps
	// running. Checked by New against S. A step that leaves personal fields
	// set while the subject field is empty fails ([ErrInvalidStep]): there
	// is no key to seal them under. A state that copies personal fields
	// from events must declare them (docs/privacy.md).
	Personal projector.Personal
}

// Saga is a saga (process manager) type: a name, a typed state S kept per
// correlation key, and handlers for events and timeouts that decide the
// next state, events to append, timeouts to schedule or cancel and whether
// the instance is complete. Register handlers with [On], [StartOn] and
// [OnTimeout], then run it with [Saga.Projection] on a dispatcher and a
// [Runner] for its timeouts.
type Saga[S any] struct {
	name string
	cfg  Config
	// continuous: the saga dead-letters failing steps itself
	// (SkipApplyErrors), its consumer running halt-on-error.
	continuous bool
	// parking: the saga parks the instances of failing steps itself
	// (ParkStream), its consumer running halt-on-error.
	parking  bool
	routes   map[string]route[S]
	types    []string
	timeouts map[string]TimeoutHandler[S]
	err      error
	ignored  atomic.Int64
	late     atomic.Int64
	// deadLettered counts continuous mode's dead letters.
	deadLettered atomic.Int64
	// parked counts the instances ParkStream parked.
	parked atomic.Int64
	// zeroPersonal holds the zero state's personal fields (Config.Personal).
	zeroPersonal map[string]json.RawMessage
}

// route is how one event type reaches an instance.
type route[S any] struct {
	et     projection.TypeName
	starts bool
	key    func(ev projector.Event) (string, error)
	handle func(ctx context.Context, in *Instance[S], ev projector.Event) error
}

var namePattern = regexp.MustCompile(`^[a-z][a-z0-9_.-]{0,99}$`)

// New returns a saga type named name (lower case letters, digits, '_', '.',
// '-', starting with a letter): the name of its consumer and of its rows.
// Zero fields of cfg take their documented defaults.
func New[S any](name string, cfg Config) *Saga[S] {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	// A step that loses a race for a stream to a timeout's step (promise 4
	// refuses the older writer) is contention, not a fault: retry soon.
	cfg.Async.RetryBackoff = cmp.Or(cfg.Async.RetryBackoff, DefaultRetryBackoff)
	cfg.Async.MaxBackoff = cmp.Or(cfg.Async.MaxBackoff, max(projection.DefaultMaxBackoff, cfg.Async.RetryBackoff))
	cfg.TimeoutAttempts = cmp.Or(cfg.TimeoutAttempts, DefaultTimeoutAttempts)
	cfg.Async.MaxAttempts = cmp.Or(cfg.Async.MaxAttempts, projection.DefaultMaxAttempts)
	s := &Saga[S]{name: name, cfg: cfg, routes: map[string]route[S]{}, timeouts: map[string]TimeoutHandler[S]{}}
	if cfg.Async.ErrorMode == projection.SkipApplyErrors {
		// The dispatcher's continuous mode would dead-letter contention
		// too; the saga tells a step's own failure from a retryable one.
		s.continuous, s.cfg.Async.ErrorMode = true, projection.HaltOnError
	}
	if cfg.Async.ErrorMode == projection.ParkStream {
		// The same: the saga parks its instance, not the event's stream.
		s.parking, s.cfg.Async.ErrorMode = true, projection.HaltOnError
	}
	switch {
	case !namePattern.MatchString(name):
		s.fail(fmt.Errorf("name %q: want lower case letters, digits, '_', '.', '-', starting with a letter, at most 100", name))
	case cfg.Async.Delivery != projection.Shared:
		s.fail(errors.New("delivery must be shared: one instance is never handled by two processes"))
	case s.cfg.Async.ErrorMode != projection.HaltOnError:
		s.fail(fmt.Errorf("error mode %v: want halt-on-error, skip-apply-errors or park-stream", cfg.Async.ErrorMode))
	case cfg.Async.PartitionKey != nil:
		s.fail(errors.New("Async.PartitionKey: a partitioned saga is partitioned by its correlation key; set only Async.Partitions"))
	case cfg.Async.RawPayloads:
		s.fail(errors.New("RawPayloads: saga handlers are typed and need decoded payloads"))
	case cfg.TimeoutAttempts < 1:
		s.fail(fmt.Errorf("timeout attempts %d below 1", cfg.TimeoutAttempts))
	}
	if err := cfg.Personal.Check(reflect.TypeFor[S]()); err != nil {
		s.fail(fmt.Errorf("state personal fields (Config.Personal): %w", err))
	}
	if s.sealed() {
		s.zeroPersonal = zeroPersonal[S](cfg.Personal)
	}
	return s
}

// Name returns the saga type's name.
func (s *Saga[S]) Name() string { return s.name }

// Personal returns the declaration of the state's personal fields
// (Config.Personal): what opens a stored state's sealed fields, as
// `projector saga show` does with [postgres.Store.OpenData].
func (s *Saga[S]) Personal() projector.Personal { return s.cfg.Personal }

// Now returns the saga's clock reading.
func (s *Saga[S]) Now() time.Time { return s.cfg.Now() }

// Err returns the first registration error, if any.
func (s *Saga[S]) Err() error { return s.err }

// EventTypes returns the handled event types in registration order.
func (s *Saga[S]) EventTypes() []string { return slices.Clone(s.types) }

// Ignored returns how many events this process saw that mapped to no
// instance and may not start one: ignored by design, counted so a wrong
// correlation key shows. Counted when handled, so a step that is rolled
// back and handled again counts twice.
func (s *Saga[S]) Ignored() int64 { return s.ignored.Load() }

// Late returns how many events this process saw reach an instance after it
// had completed or failed (also counted per instance, in late_events).
func (s *Saga[S]) Late() int64 { return s.late.Load() }

// DeadLettered returns how many events this process dead-lettered in
// continuous mode (their instances marked failed). Counted when handled, so
// a batch rolled back and handled again counts twice; the dead-letter table
// is the record.
func (s *Saga[S]) DeadLettered() int64 { return s.deadLettered.Load() }

// Parked returns how many instances this process parked (ParkStream).
// Counted when handled, so a batch rolled back and handled again counts
// twice; the park table is the record (`projector parked list`).
func (s *Saga[S]) Parked() int64 { return s.parked.Load() }

func (s *Saga[S]) fail(err error) error {
	err = fmt.Errorf("%w: saga %q: %w", ErrInvalidDefinition, s.name, err)
	if s.err == nil {
		s.err = err
	}
	return err
}

// Handler decides a step of an instance for an event of payload type T: it
// reads and changes in.State and records appends, timeouts and completion
// on in. It must not write to the database itself: the saga applies its
// decisions in the dispatcher's transaction, so a step happens exactly once,
// and a handler free of I/O can be tested without a database (sagatest).
// An error fails the step; nothing of it is written and the event is
// retried like a failing projection's.
type Handler[S, T any] func(ctx context.Context, in *Instance[S], ev projector.Event, payload T) error

// KeyFunc takes an event's correlation key, the instance it belongs to: a
// ticket id, an order id. An empty key, or one that is not storable as a
// name (over [projector.MaxNameLength] bytes, invalid UTF-8, a NUL), is an
// error ([ErrInvalidStep]).
type KeyFunc[T any] func(ev projector.Event, payload T) string

// ByStream is a [KeyFunc] for sagas keyed by the handled event's stream id.
func ByStream[T any](ev projector.Event, _ T) string { return ev.Stream.ID }

// On registers h for events of type et that reach an existing instance: the
// instance key(ev, payload) names. An event whose instance does not exist
// is ignored and counted ([Saga.Ignored]).
func On[S, T any](s *Saga[S], et projector.EventType[T], key KeyFunc[T], h Handler[S, T]) error {
	return register(s, et, false, key, h)
}

// StartOn registers h for events of type et that may start an instance:
// when none exists for the key, one is created with a zero state (h sees
// [Instance.IsNew] true). Two start events for one key give one instance;
// the second finds the first.
func StartOn[S, T any](s *Saga[S], et projector.EventType[T], key KeyFunc[T], h Handler[S, T]) error {
	return register(s, et, true, key, h)
}

func register[S, T any](s *Saga[S], et projector.EventType[T], starts bool, key KeyFunc[T], h Handler[S, T]) error {
	name := et.Name()
	switch {
	case name == "":
		return s.fail(errors.New("handler for an undefined event type (a zero EventType: define it with projector.Define first)"))
	case key == nil:
		return s.fail(fmt.Errorf("nil key function for %q", name))
	case h == nil:
		return s.fail(fmt.Errorf("nil handler for %q", name))
	}
	if _, dup := s.routes[name]; dup {
		return s.fail(fmt.Errorf("%q handled twice", name))
	}
	typed := func(ev projector.Event) (T, error) {
		p, ok := ev.Payload.(T)
		if !ok {
			return p, fmt.Errorf("%w: %s handler of saga %q expects %T, got %T", projector.ErrInvalidPayload, ev.Type, s.name, p, ev.Payload)
		}
		return p, nil
	}
	s.routes[name] = route[S]{
		et:     et,
		starts: starts,
		key: func(ev projector.Event) (string, error) {
			p, err := typed(ev)
			if err != nil {
				return "", err
			}
			k := key(ev, p)
			if k == "" {
				return "", fmt.Errorf("%w: saga %q: %s event %s has an empty correlation key", ErrInvalidStep, s.name, ev.Type, ev.ID)
			}
			// A key is stored, indexed and printed: held to a name's rules,
			// so a key PostgreSQL cannot index (100 kB) or store (NUL,
			// invalid UTF-8) fails the event with this error, not the
			// driver's with the key in it.
			if len(k) > projector.MaxNameLength || projector.ValidText(k) != nil {
				return "", fmt.Errorf("%w: saga %q: %s event %s has a correlation key %s that is not storable (valid UTF-8 without NUL, at most %d bytes)",
					ErrInvalidStep, s.name, projector.Printable(ev.Type), ev.ID, projector.Printable(k), projector.MaxNameLength)
			}
			return k, nil
		},
		handle: func(ctx context.Context, in *Instance[S], ev projector.Event) error {
			p, err := typed(ev)
			if err != nil {
				return err
			}
			return h(ctx, in, ev, p)
		},
	}
	s.types = append(s.types, name)
	return nil
}

// Timeout is what a timeout handler receives.
type Timeout struct {
	// ID identifies the scheduled timeout; it is the causation id of what
	// its step appends.
	ID uuid.UUID
	// Name is the name it was scheduled under.
	Name string
	// Due is when it was due; the handler runs at or after it, never before.
	Due time.Time
}

// TimeoutHandler decides the step of an instance whose timeout fired. It
// should check in.State rather than trust that cancellation happened: the
// state is the truth ("escalate unless assigned").
type TimeoutHandler[S any] func(ctx context.Context, in *Instance[S], t Timeout) error

// OnTimeout registers h for timeouts scheduled under name.
func OnTimeout[S any](s *Saga[S], name string, h TimeoutHandler[S]) error {
	switch {
	case name == "":
		return s.fail(errors.New("timeout handler for an empty name"))
	case len(name) > projector.MaxNameLength || projector.Printable(name) != name:
		// The name is stored with each timeout and shown by the CLI and the
		// console: a name PostgreSQL refused failed every step scheduling it.
		return s.fail(fmt.Errorf("timeout name %s: want printable text of at most %d bytes", projector.Printable(name), projector.MaxNameLength))
	case h == nil:
		return s.fail(fmt.Errorf("nil handler for timeout %q", name))
	}
	if _, dup := s.timeouts[name]; dup {
		return s.fail(fmt.Errorf("timeout %q handled twice", name))
	}
	s.timeouts[name] = h
	return nil
}

// Validate reports a registration error, or a handled type reg does not
// define.
func (s *Saga[S]) Validate(reg *projector.Registry) error {
	if s.err != nil {
		return s.err
	}
	if len(s.types) == 0 {
		return fmt.Errorf("%w: saga %q handles no event types", ErrInvalidDefinition, s.name)
	}
	starts := false
	for _, typ := range s.types {
		if _, ok := reg.Lookup(typ); !ok {
			return fmt.Errorf("%w: saga %q handles %q, which the registry does not define", ErrInvalidDefinition, s.name, typ)
		}
		starts = starts || s.routes[typ].starts
	}
	if !starts {
		return fmt.Errorf("%w: saga %q has no start event (register one with StartOn)", ErrInvalidDefinition, s.name)
	}
	return nil
}

// Instance is one saga instance as a handler sees it: its state, to read
// and change, and the decisions of the step being taken.
type Instance[S any] struct {
	// State is the instance's state; the handler changes it in place.
	State S

	id          uuid.UUID
	key         string
	tenant      string
	correlation uuid.UUID
	isNew       bool
	version     int64
	now         time.Time
	timeouts    map[string]TimeoutHandler[S]
	saga        string

	ops       []op
	completed bool
	err       error
}

// opKind is a recorded decision.
type opKind int

const (
	opAppend opKind = iota
	opSchedule
	opCancel
	opCommand
)

type op struct {
	kind     opKind
	stream   projector.StreamRef
	expected projector.ExpectedVersion
	payloads []any
	name     string
	at       time.Time
	// command runs an aggregate command in the step's transaction and
	// returns how many events it appended.
	command   func(ctx context.Context, tx pgx.Tx) (int, error)
	aggregate string
}

// ID returns the instance id.
func (in *Instance[S]) ID() uuid.UUID { return in.id }

// Key returns the instance's correlation key.
func (in *Instance[S]) Key() string { return in.key }

// Tenant returns the tenant the instance belongs to (that of the event that
// started it).
func (in *Instance[S]) Tenant() string { return in.tenant }

// CorrelationID returns the correlation id every event the instance appends
// carries: the start event's correlation id, or a new one.
func (in *Instance[S]) CorrelationID() uuid.UUID { return in.correlation }

// IsNew reports whether this step creates the instance.
func (in *Instance[S]) IsNew() bool { return in.isNew }

// Version returns the number of steps the instance took before this one.
func (in *Instance[S]) Version() int64 { return in.version }

// Now returns the saga clock's time for this step: schedule timeouts
// relative to it.
func (in *Instance[S]) Now() time.Time { return in.now }

// Append appends payloads to stream when the step commits, checked against
// expected, with the instance's correlation id and the handled event's (or
// timeout's) id as causation. Appending to a stream of the instance's own
// tenant is the rule: use projector.TenantStream(in.Tenant(), ...).
func (in *Instance[S]) Append(stream projector.StreamRef, expected projector.ExpectedVersion, payloads ...any) {
	if len(payloads) == 0 {
		in.setErr(fmt.Errorf("append to %s: no payloads", stream))
		return
	}
	in.ops = append(in.ops, op{kind: opAppend, stream: stream, expected: expected, payloads: slices.Clone(payloads)})
}

// Command runs a command on the aggregate in stream when the step is
// applied, in the step's transaction: the aggregate is fetched for writing
// through repo (its events folded, the version noted), decide runs on its
// current state, and the events it returns are appended at that version,
// with the instance's correlation id and the step's cause, so the
// aggregate's invariants hold and the append commits with the step or not
// at all. A concurrent write to the stream makes the step fail and be
// retried. Without a database (sagatest) the command is recorded, not run.
func Command[S, A any](in *Instance[S], repo *aggregate.Repository[A], stream projector.StreamRef, decide aggregate.Decide[A]) {
	if repo == nil || decide == nil {
		in.setErr(fmt.Errorf("command on %s: nil repository or decide function", stream))
		return
	}
	in.ops = append(in.ops, op{kind: opCommand, stream: stream, aggregate: repo.Name(),
		command: func(ctx context.Context, tx pgx.Tx) (int, error) {
			w, err := repo.FetchForWriting(ctx, tx, stream)
			if err != nil {
				return 0, fmt.Errorf("command on %s: %w", stream, err)
			}
			payloads, err := decide(ctx, w.Loaded())
			if err != nil || len(payloads) == 0 {
				return 0, err
			}
			if _, err := w.Append(ctx, payloads...); err != nil {
				return 0, fmt.Errorf("command on %s: %w", stream, err)
			}
			return len(payloads), nil
		}})
}

// maxTimeoutAt is the latest time a timeout may be scheduled for.
var maxTimeoutAt = time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC)

// Schedule schedules the timeout name to fire at at, replacing one of that
// name that is pending. at before [Instance.Now] is an error of the step.
func (in *Instance[S]) Schedule(name string, at time.Time) {
	switch {
	case in.timeouts[name] == nil:
		in.setErr(fmt.Errorf("schedule timeout %q: no handler registered for it (OnTimeout)", name))
		return
	case at.Before(in.now):
		in.setErr(fmt.Errorf("schedule timeout %q at %s: in the past (now %s)", name, at.Format(time.RFC3339Nano), in.now.Format(time.RFC3339Nano)))
		return
	case at.After(maxTimeoutAt):
		// Past PostgreSQL's timestamptz (year 294276) the step's write
		// failed with the driver's error; a deadline past 9999 is a mistake.
		in.setErr(fmt.Errorf("schedule timeout %q at %s: after %s", name, at.Format(time.RFC3339Nano), maxTimeoutAt.Format(time.RFC3339)))
		return
	}
	in.ops = append(in.ops, op{kind: opSchedule, name: name, at: at})
}

// After schedules the timeout name to fire d after [Instance.Now].
func (in *Instance[S]) After(name string, d time.Duration) {
	if d < 0 {
		in.setErr(fmt.Errorf("schedule timeout %q after %v: negative", name, d))
		return
	}
	in.Schedule(name, in.now.Add(d))
}

// Cancel cancels the pending timeout name, if there is one.
func (in *Instance[S]) Cancel(name string) {
	in.ops = append(in.ops, op{kind: opCancel, name: name})
}

// Complete marks the instance completed when the step commits: its pending
// timeouts are cancelled and later events are ignored and counted.
func (in *Instance[S]) Complete() { in.completed = true }

func (in *Instance[S]) setErr(err error) {
	if in.err == nil {
		in.err = fmt.Errorf("%w: saga %q, instance %q: %w", ErrInvalidStep, in.saga, in.key, err)
	}
}

// Snapshot is an instance as stored, the input of a step.
type Snapshot[S any] struct {
	ID            uuid.UUID
	Key           string
	Tenant        string
	CorrelationID uuid.UUID
	Status        Status
	Version       int64
	State         S
}

// Decision is what a step decided: the outcome of [Saga.Decide] and
// [Saga.DecideTimeout], applied by the saga in the dispatcher's (or the
// runner's) transaction, or inspected by sagatest.
type Decision[S any] struct {
	// State is the instance's state after the step.
	State S
	// Appends are the appends, in the order the handler made them.
	Appends []Append
	// Timeouts are the timeouts scheduled (replacing any pending one of the
	// same name) and cancelled, in the order the handler made them.
	Timeouts []TimeoutOp
	// Commands are the aggregate commands decided ([Command]), in order.
	Commands []CommandOp
	// Completed is true when the step completed the instance.
	Completed bool

	ops []op
}

// Append is an append a step decided.
type Append struct {
	Stream   projector.StreamRef
	Expected projector.ExpectedVersion
	Payloads []any
}

// CommandOp is an aggregate command a step decided: on the aggregate
// repository named Aggregate, for Stream.
type CommandOp struct {
	Aggregate string
	Stream    projector.StreamRef
}

// TimeoutOp is a timeout a step scheduled (At set) or cancelled (Cancel).
type TimeoutOp struct {
	Name   string
	At     time.Time
	Cancel bool
}

// Route says how the saga handles an event type: whether it does at all,
// whether it may start an instance, and the event's key.
func (s *Saga[S]) Route(ev projector.Event) (key string, starts bool, handled bool, err error) {
	r, ok := s.routes[ev.Type]
	if !ok {
		return "", false, false, nil
	}
	key, err = r.key(ev)
	return key, r.starts, true, err
}

// Decide runs the handler for ev on cur (an active instance, or a new one's
// zero snapshot with IsNew) at time now, and returns its decisions. reg, when
// not nil, checks that appended payloads are of defined types. It writes
// nothing: [Saga.Projection] applies the decision, sagatest inspects it.
func (s *Saga[S]) Decide(ctx context.Context, reg *projector.Registry, cur Snapshot[S], isNew bool, ev projector.Event, now time.Time) (Decision[S], error) {
	r, ok := s.routes[ev.Type]
	if !ok {
		return Decision[S]{}, fmt.Errorf("%w: saga %q does not handle %q", ErrInvalidStep, s.name, ev.Type)
	}
	in := s.instance(cur, isNew, now)
	if err := guard(s.name, func() error { return r.handle(ctx, in, ev) }); err != nil {
		return Decision[S]{}, err
	}
	return s.decision(in, reg)
}

// guard runs a handler, turning its panic into the step's error: a
// handler that panics fails its step like one that returns an error
// (projections.md), so continuous mode dead-letters the event and
// ParkStream parks the instance. Left to the dispatcher's own recover, a
// panic escaped the saga's handling of its modes and the consumer went
// dead (a relay and saga audit).
func guard(saga string, handler func() error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("saga %q: panic in handler: %v", saga, p)
		}
	}()
	return handler()
}

// DecideTimeout runs the handler of timeout t on cur at time now.
func (s *Saga[S]) DecideTimeout(ctx context.Context, reg *projector.Registry, cur Snapshot[S], t Timeout, now time.Time) (Decision[S], error) {
	h, ok := s.timeouts[t.Name]
	if !ok {
		return Decision[S]{}, fmt.Errorf("%w: saga %q has no handler for timeout %q", ErrInvalidStep, s.name, t.Name)
	}
	in := s.instance(cur, false, now)
	if err := guard(s.name, func() error { return h(ctx, in, t) }); err != nil {
		return Decision[S]{}, err
	}
	return s.decision(in, reg)
}

func (s *Saga[S]) instance(cur Snapshot[S], isNew bool, now time.Time) *Instance[S] {
	return &Instance[S]{State: cur.State, id: cur.ID, key: cur.Key, tenant: cur.Tenant, correlation: cur.CorrelationID,
		isNew: isNew, version: cur.Version, now: now, timeouts: s.timeouts, saga: s.name}
}

func (s *Saga[S]) decision(in *Instance[S], reg *projector.Registry) (Decision[S], error) {
	if in.err != nil {
		return Decision[S]{}, in.err
	}
	d := Decision[S]{State: in.State, Completed: in.completed, ops: in.ops}
	for _, o := range in.ops {
		switch o.kind {
		case opAppend:
			if err := o.stream.Validate(); err != nil {
				in.setErr(fmt.Errorf("append to %s: %w", o.stream, err))
				return Decision[S]{}, in.err
			}
			if reg != nil {
				for _, p := range o.payloads {
					if _, err := reg.Encode(p); err != nil {
						in.setErr(fmt.Errorf("append to %s: %w", o.stream, err))
						return Decision[S]{}, in.err
					}
				}
			}
			d.Appends = append(d.Appends, Append{Stream: o.stream, Expected: o.expected, Payloads: o.payloads})
		case opSchedule:
			d.Timeouts = append(d.Timeouts, TimeoutOp{Name: o.name, At: o.at})
		case opCancel:
			d.Timeouts = append(d.Timeouts, TimeoutOp{Name: o.name, Cancel: true})
		case opCommand:
			d.Commands = append(d.Commands, CommandOp{Aggregate: o.aggregate, Stream: o.stream})
		}
	}
	data, err := json.Marshal(in.State)
	if err != nil {
		in.setErr(fmt.Errorf("encode state: %w", err))
		return Decision[S]{}, in.err
	}
	if s.sealed() {
		if _, err := s.sealable(data); err != nil {
			in.setErr(err)
			return Decision[S]{}, in.err
		}
	}
	return d, nil
}
