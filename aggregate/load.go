package aggregate

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/stores/postgres"
)

// Query bounds a load in time. The zero value loads the current state; with
// both fields set, the load stops at whichever bound comes first.
type Query struct {
	// Version, when above 0, loads the state as of that version: the fold
	// of events 1 to Version. Without Until, a stream that never reached
	// Version is [projector.ErrNotFound].
	Version int64
	// Until, when set, loads the state as of that instant: the fold of the
	// events recorded (by the database clock, at insert) at or before it.
	Until time.Time
	// IncludeArchived folds an archived stream (`projector streams
	// archive`) from the archive. Without it, loading an archived stream
	// fails with an error matching [postgres.ErrStreamArchived], unless a
	// snapshot already holds its last version.
	IncludeArchived bool
}

// Load returns the current state and version of stream, read through the
// store's pool. A stream without events fails with an error matching
// [projector.ErrNotFound].
func (r *Repository[S]) Load(ctx context.Context, stream projector.StreamRef) (Loaded[S], error) {
	return r.LoadTx(ctx, r.store.Pool(), stream, Query{})
}

// LoadVersion returns the state of stream as it was at version: what a
// reader saw right after event number version was appended. It fails with
// [ErrInvalidQuery] for a version below 1 and with [projector.ErrNotFound]
// when the stream never reached it.
func (r *Repository[S]) LoadVersion(ctx context.Context, stream projector.StreamRef, version int64) (Loaded[S], error) {
	if version < 1 {
		return Loaded[S]{}, fmt.Errorf("load aggregate %q from stream %s: %w: version %d (versions start at 1)", r.name, stream, ErrInvalidQuery, version)
	}
	return r.LoadTx(ctx, r.store.Pool(), stream, Query{Version: version})
}

// LoadAsOf returns the state of stream as it was at instant t: the fold of
// every event recorded at or before t. It fails with [projector.ErrNotFound]
// when the stream had no events yet at t. Times are compared with the
// database clock's recorded_at, to the microsecond.
func (r *Repository[S]) LoadAsOf(ctx context.Context, stream projector.StreamRef, t time.Time) (Loaded[S], error) {
	if t.IsZero() {
		return Loaded[S]{}, fmt.Errorf("load aggregate %q from stream %s: %w: zero time", r.name, stream, ErrInvalidQuery)
	}
	return r.LoadTx(ctx, r.store.Pool(), stream, Query{Until: t})
}

// LoadTx is the general load: on any connection or inside a transaction
// (which then sees its own uncommitted events), bounded by q. Snapshots of
// the aggregate's current shape at or below the bounds are used when the
// aggregate keeps them; loading never writes.
func (r *Repository[S]) LoadTx(ctx context.Context, db postgres.DBTX, stream projector.StreamRef, q Query) (Loaded[S], error) {
	l, err := r.loadTx(ctx, db, stream, q)
	if err != nil {
		return Loaded[S]{}, fmt.Errorf("load aggregate %q from stream %s: %w", r.name, stream, err)
	}
	return l, nil
}

func (r *Repository[S]) loadTx(ctx context.Context, db postgres.DBTX, stream projector.StreamRef, q Query) (Loaded[S], error) {
	if db == nil {
		return Loaded[S]{}, errors.New("nil connection")
	}
	if err := stream.Validate(); err != nil {
		return Loaded[S]{}, err
	}
	if q.Version < 0 {
		return Loaded[S]{}, fmt.Errorf("%w: version %d", ErrInvalidQuery, q.Version)
	}
	l, err := r.fold(ctx, db, stream, q)
	if err != nil {
		return Loaded[S]{}, err
	}
	switch {
	case !l.Exists() && !q.Until.IsZero():
		return Loaded[S]{}, fmt.Errorf("%w: no events recorded at or before %s", projector.ErrNotFound, q.Until.Format(time.RFC3339Nano))
	case !l.Exists():
		return Loaded[S]{}, fmt.Errorf("%w: no events", projector.ErrNotFound)
	case q.Until.IsZero() && l.Version < q.Version:
		return Loaded[S]{}, fmt.Errorf("%w: no version %d, the stream is at version %d", projector.ErrNotFound, q.Version, l.Version)
	}
	return l, nil
}

// fold reads the newest usable snapshot within q's bounds, if the aggregate
// keeps snapshots, and folds the events after it. A stream without events
// returns the zero state at version 0.
func (r *Repository[S]) fold(ctx context.Context, db postgres.DBTX, stream projector.StreamRef, q Query) (Loaded[S], error) {
	l := Loaded[S]{Stream: stream}
	if r.snapshotting() {
		var err error
		if l, err = r.readSnapshot(ctx, db, stream, q.Version, q.Until); err != nil {
			return Loaded[S]{}, err
		}
		if q.Version > 0 && l.Version == q.Version {
			return l, nil
		}
	}
	events, err := r.store.ReadStreamTx(ctx, db, stream, postgres.StreamQuery{FromVersion: l.Version + 1, ToVersion: q.Version, Until: q.Until, IncludeArchived: q.IncludeArchived})
	if err != nil {
		return Loaded[S]{}, err
	}
	for _, ev := range events {
		if !q.Until.IsZero() && ev.Version != l.Version+1 {
			// Recorded times only run backwards within a stream if the
			// server's clock did; the state as of Until is then the
			// prefix recorded before it.
			break
		}
		if err := r.apply(&l, ev); err != nil {
			return Loaded[S]{}, err
		}
	}
	return l, nil
}
