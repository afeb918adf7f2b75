package aggregate

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"reflect"
	"regexp"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/stores/postgres"
)

// ErrLocked is [postgres.ErrLocked], repeated here so code that only uses
// this package can test for it: an exclusive fetch asked not to wait found
// the stream locked by another transaction.
var ErrLocked = postgres.ErrLocked

// ErrInvalidConfig means [New] was given a configuration it cannot use: a
// name that is not an aggregate name, no folds, a snapshot setting out of
// range.
var ErrInvalidConfig = errors.New("projector: invalid aggregate configuration")

// ErrInvalidQuery means a load's bounds are out of range: a version below 1
// for [Repository.LoadVersion], a negative [Query.Version], a zero time for
// [Repository.LoadAsOf].
var ErrInvalidQuery = errors.New("projector: invalid aggregate query")

// Fold applies one event type to an aggregate's state. Make one with [On] or
// [OnEvent] and list it in [Config.Folds].
type Fold[S any] struct {
	eventType string
	goType    reflect.Type
	apply     func(state *S, ev projector.Event) error
}

// On folds events of type et into the state with fn. The payload arrives
// typed, so a fold reads like the event it handles and a wrong payload type
// is a compile error. Use [OnEvent] when the fold needs the envelope (the
// version, the time it was recorded, the actor) or must be able to fail.
func On[S, T any](et projector.EventType[T], fn func(state *S, payload T)) Fold[S] {
	var wrapped func(*S, projector.Event, T) error
	if fn != nil {
		wrapped = func(s *S, _ projector.Event, p T) error { fn(s, p); return nil }
	}
	return OnEvent(et, wrapped)
}

// OnEvent is [On] for folds that need the whole event or may fail. An error
// fails the load (the stream cannot be folded) or, when it comes from events
// just appended through a [Writer], aborts the transaction, so a stream can
// never be committed into a state its own aggregate cannot load.
func OnEvent[S, T any](et projector.EventType[T], fn func(state *S, ev projector.Event, payload T) error) Fold[S] {
	f := Fold[S]{eventType: et.Name(), goType: reflect.TypeFor[T]()}
	if fn != nil {
		f.apply = func(s *S, ev projector.Event) error {
			p, ok := ev.Payload.(T)
			if !ok {
				return fmt.Errorf("event %s carries a %T payload, the fold expects %s", ev.Type, ev.Payload, f.goType)
			}
			return fn(s, ev, p)
		}
	}
	return f
}

// Config defines an aggregate type for [New]. Name and Folds are required;
// every other field has a documented default.
type Config[S any] struct {
	// Name identifies the aggregate type: it keys its snapshots and names it
	// in errors. Lower case letters, digits and _, dotted parts allowed
	// ("ticket", "billing.invoice"). Two aggregate types may fold the same
	// streams under different names.
	Name string
	// Folds say how each event type changes the state. An event whose type
	// has no fold still advances the version and leaves the state alone, so
	// a stream may carry events this aggregate does not care about.
	Folds []Fold[S]
	// Snapshots, when Every is set, stores the folded state every so many
	// events. The zero value never snapshots.
	Snapshots Snapshots
	// Logger receives the rare warnings (a snapshot that could not be
	// written or decoded); default slog.Default().
	Logger *slog.Logger
}

// Snapshots configures an aggregate type's snapshots. The state type S must
// survive encoding/json unchanged (exported fields, or MarshalJSON and
// UnmarshalJSON), since a load that starts from a snapshot must equal one
// that folds every event.
type Snapshots struct {
	// Every is how many events a [Writer] may append past the latest
	// snapshot before it writes a new one, inside the same transaction.
	// 0 disables snapshots.
	Every int64
	// Version is the shape of the state: bump it whenever S's JSON or what
	// its folds compute changes. Snapshots of any other version are
	// ignored, never decoded, and new ones are written as the aggregate is
	// used. 0 means 1.
	Version int
	// Keep is how many snapshots to keep per stream and aggregate, newest
	// first and whatever their Version, so snapshots of a retired shape age
	// out too; older ones are deleted when a new one is written. 0 keeps
	// every snapshot, so loads as of any version or time start near their
	// target.
	Keep int
	// Personal declares the state's personal fields and its data subject's
	// id field, by top-level JSON name, as an event type's TypeConfig does
	// for a payload: snapshots store those fields sealed under the
	// subject's key, never in the clear, so forgetting the subject reaches
	// them too; after a forget they load as zero values. Checked by New
	// against S. A state that copies personal fields from events and is
	// snapshotted must declare them (docs/privacy.md).
	Personal projector.Personal
}

// Repository loads and writes one aggregate type on one store. It is safe
// for concurrent use; build it once at start-up with [New].
type Repository[S any] struct {
	store  *postgres.Store
	name   string
	folds  map[string]func(*S, projector.Event) error
	snap   Snapshots
	logger *slog.Logger
	sql    snapshotStatements
}

var namePattern = regexp.MustCompile(`^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*$`)

// New checks cfg against the store's event registry and returns the
// aggregate type's repository. Mistakes that would otherwise surface at
// 3 a.m. fail here: a missing name, no folds, two folds for one event type,
// a fold for an event type the store's registry does not define with that
// payload (a handle from another registry), a negative snapshot setting,
// snapshots declaring personal fields on a store without a master key
// ([postgres.ErrNoMasterKey]).
func New[S any](store *postgres.Store, cfg Config[S]) (*Repository[S], error) {
	if store == nil {
		return nil, fmt.Errorf("%w: nil store", ErrInvalidConfig)
	}
	if !namePattern.MatchString(cfg.Name) || len(cfg.Name) > projector.MaxNameLength {
		return nil, fmt.Errorf("%w: aggregate %s: a name is lower case letters, digits and _, dotted parts allowed, such as \"ticket\", at most %d bytes",
			ErrInvalidConfig, projector.Quoted(cfg.Name), projector.MaxNameLength)
	}
	if len(cfg.Folds) == 0 {
		return nil, fmt.Errorf("%w: aggregate %q: no folds; list one per event type with aggregate.On", ErrInvalidConfig, cfg.Name)
	}
	snap := cfg.Snapshots
	if snap.Every < 0 || snap.Version < 0 || snap.Keep < 0 || snap.Version > math.MaxInt32 {
		return nil, fmt.Errorf("%w: aggregate %q: snapshot settings must not be negative, and Version fits PostgreSQL's integer (Every %d, Version %d, Keep %d)",
			ErrInvalidConfig, cfg.Name, snap.Every, snap.Version, snap.Keep)
	}
	if err := snap.Personal.Check(reflect.TypeFor[S]()); err != nil {
		return nil, fmt.Errorf("%w: aggregate %q: snapshot Personal: %w", ErrInvalidConfig, cfg.Name, err)
	}
	if snap.Personal.Subject != "" {
		if err := store.CheckMasterKey(fmt.Sprintf("aggregate %q: snapshot Personal", cfg.Name)); err != nil {
			return nil, err
		}
	}
	snap.Version = cmp.Or(snap.Version, 1)
	r := &Repository[S]{
		store:  store,
		name:   cfg.Name,
		folds:  make(map[string]func(*S, projector.Event) error, len(cfg.Folds)),
		snap:   snap,
		logger: cmp.Or(cfg.Logger, slog.Default()),
		sql:    buildSnapshotStatements(store.Table("projector_snapshots")),
	}
	for i, f := range cfg.Folds {
		if f.eventType == "" || f.apply == nil {
			return nil, fmt.Errorf("%w: aggregate %q: fold %d has no event type or no function (build folds with aggregate.On)", ErrInvalidConfig, cfg.Name, i)
		}
		info, ok := store.Registry().Lookup(f.eventType)
		if !ok {
			return nil, fmt.Errorf("%w: aggregate %q: fold for %q: %w: not defined in the store's registry", ErrInvalidConfig, cfg.Name, f.eventType, projector.ErrUnknownEventType)
		}
		if info.GoType != f.goType {
			return nil, fmt.Errorf("%w: aggregate %q: fold for %q takes %s but the store's registry defines the payload as %s", ErrInvalidConfig, cfg.Name, f.eventType, f.goType, info.GoType)
		}
		if _, dup := r.folds[f.eventType]; dup {
			return nil, fmt.Errorf("%w: aggregate %q: two folds for %q", ErrInvalidConfig, cfg.Name, f.eventType)
		}
		r.folds[f.eventType] = f.apply
	}
	return r, nil
}

// Name returns the aggregate type's name.
func (r *Repository[S]) Name() string { return r.name }

// Loaded is an aggregate's state as of a version of its stream.
type Loaded[S any] struct {
	// Stream is the stream the state was folded from.
	Stream projector.StreamRef
	// State is the folded state. Every load folds a state of its own, but
	// a Writer folds its appends into the state it fetched, so maps (and
	// slices' backing arrays) in a state it returned may change on its next
	// append: copy them if you keep them across appends.
	State S
	// Version is the version of the last event folded into State; 0 for a
	// stream that does not exist yet (only [Repository.FetchForWriting] and
	// friends return those).
	Version int64
	// FromSnapshot is the stream version of the snapshot the load started
	// from, or 0 when it folded every event.
	FromSnapshot int64
}

// Exists reports whether the stream has any event: false for the empty
// state of a stream a [Writer] is about to create.
func (l Loaded[S]) Exists() bool { return l.Version > 0 }

// apply folds one event into l, checking that it is the next version: the store
// writes versions without gaps, so a gap means the read was cut short.
func (r *Repository[S]) apply(l *Loaded[S], ev projector.Event) error {
	if ev.Version != l.Version+1 {
		return fmt.Errorf("fold %s into aggregate %q: version %d follows version %d", ev.Stream, r.name, ev.Version, l.Version)
	}
	if apply, ok := r.folds[ev.Type]; ok {
		if err := apply(&l.State, ev); err != nil {
			return fmt.Errorf("fold event %d (%s) of stream %s into aggregate %q: %w", ev.Version, ev.Type, ev.Stream, r.name, err)
		}
	}
	l.Version = ev.Version
	return nil
}

// snapshotting reports whether the aggregate type keeps snapshots.
func (r *Repository[S]) snapshotting() bool { return r.snap.Every > 0 }
