package aggregate

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/stores/postgres"
)

// Writer is an aggregate fetched for writing inside a transaction: its state
// and version as read in that transaction, and the way to append to it with
// that version checked. [Repository.FetchForWriting] and
// [Repository.FetchExclusive] return one. It belongs to its transaction and,
// like it, is not safe for concurrent use.
type Writer[S any] struct {
	repo *Repository[S]
	tx   pgx.Tx
	cur  Loaded[S]
	// snapAt is the newest snapshot of the current shape known to exist at
	// or below cur.Version: the base of the Snapshots.Every policy.
	snapAt int64
	broken error
}

// ExclusiveOptions tunes [Repository.FetchExclusive]. The zero value waits
// for the lock.
type ExclusiveOptions struct {
	// NoWait fails at once with an error matching [ErrLocked] when another
	// transaction holds the stream, instead of waiting for it to finish.
	NoWait bool
}

// FetchForWriting reads stream's state and version inside tx, for a
// decision the caller then records by appending through the returned
// [Writer]. Nothing is locked: each [Writer.Append] asserts that the stream
// is still at the version the writer holds, so if another transaction
// appended in between, the append fails with a [*projector.ConcurrencyError]
// (errors.Is [projector.ErrConcurrency]) and the caller retries in a new
// transaction. Use [Writer.AssertVersion] to hold the version until commit
// without appending, and [Repository.Handle] for the whole
// load-decide-append-retry loop.
//
// A stream that does not exist yet is not an error: the writer holds the
// zero state at version 0 and its first append creates the stream, failing
// if someone else created it first.
func (r *Repository[S]) FetchForWriting(ctx context.Context, tx pgx.Tx, stream projector.StreamRef) (*Writer[S], error) {
	w, err := r.fetch(ctx, tx, stream, nil)
	if err != nil {
		return nil, fmt.Errorf("fetch aggregate %q from stream %s for writing: %w", r.name, stream, err)
	}
	return w, nil
}

// FetchExclusive is [Repository.FetchForWriting] for a stream only this
// transaction may write until it ends: it first locks the stream (see
// [postgres.Store.LockStream]), so another FetchExclusive of the stream, a
// [Writer.AssertVersion] and a plain append to it wait for this transaction
// to commit or roll back, and then read what it wrote. Use it where
// conflicts are common and retrying is costly; optimistic
// FetchForWriting is cheaper when they are rare.
//
// With opts.NoWait a stream locked by another transaction fails at once
// with an error matching [ErrLocked]; roll the transaction back.
//
// A stream that does not exist yet is locked too (by an advisory lock on its
// name), so two exclusive writers creating the same stream take turns and
// the second sees the first one's events. A plain [postgres.Store.Append]
// that creates the stream meanwhile is not held back; the writer's own
// append then fails the version check. Exclusive writing assumes read
// committed isolation.
//
// The append still checks the version and still refuses a transaction older
// than the stream's last writer (promise 4): a transaction that wrote
// elsewhere before it locked the stream can get the retryable
// [projector.ErrConcurrency]. Lock first, or use [Repository.Handle].
func (r *Repository[S]) FetchExclusive(ctx context.Context, tx pgx.Tx, stream projector.StreamRef, opts ...ExclusiveOptions) (*Writer[S], error) {
	var o ExclusiveOptions
	switch len(opts) {
	case 0:
	case 1:
		o = opts[0]
	default:
		return nil, fmt.Errorf("fetch aggregate %q from stream %s exclusively: at most one ExclusiveOptions", r.name, stream)
	}
	w, err := r.fetch(ctx, tx, stream, &postgres.LockOptions{NoWait: o.NoWait})
	if err != nil {
		return nil, fmt.Errorf("fetch aggregate %q from stream %s exclusively: %w", r.name, stream, err)
	}
	return w, nil
}

func (r *Repository[S]) fetch(ctx context.Context, tx pgx.Tx, stream projector.StreamRef, lock *postgres.LockOptions) (*Writer[S], error) {
	if tx == nil {
		return nil, errors.New("nil transaction: a writer reads and appends inside the caller's transaction")
	}
	if err := stream.Validate(); err != nil {
		return nil, err
	}
	w := &Writer[S]{repo: r, tx: tx, cur: Loaded[S]{Stream: stream}}
	var q Query
	if lock != nil {
		v, err := r.store.LockStream(ctx, tx, stream, *lock)
		if err != nil {
			return nil, err
		}
		if v == 0 {
			return w, nil
		}
		q.Version = v
	}
	l, err := r.fold(ctx, tx, stream, q)
	if err != nil {
		return nil, err
	}
	if q.Version > 0 && l.Version != q.Version {
		return nil, fmt.Errorf("stream head is at version %d but only %d events could be read", q.Version, l.Version)
	}
	w.cur, w.snapAt = l, l.FromSnapshot
	return w, nil
}

// Stream returns the stream the writer writes to.
func (w *Writer[S]) Stream() projector.StreamRef { return w.cur.Stream }

// State returns the state as of [Writer.Version], including what this
// writer appended.
func (w *Writer[S]) State() S { return w.cur.State }

// Version returns the stream version the writer's next append expects: the
// fetched version plus everything appended through the writer.
func (w *Writer[S]) Version() int64 { return w.cur.Version }

// Loaded returns the state, version and stream together.
func (w *Writer[S]) Loaded() Loaded[S] { return w.cur }

// Tx returns the transaction the writer works in.
func (w *Writer[S]) Tx() pgx.Tx { return w.tx }

// Append appends payloads to the stream inside the writer's transaction,
// expecting the stream to be at [Writer.Version] (or not to exist, at
// version 0). When another transaction appended first it fails with a
// [*projector.ConcurrencyError], nothing is written and the writer is
// unchanged: roll back and retry in a new transaction. On success the
// writer's state and version include the new events, folded from their
// stored JSON exactly as a later load would fold them, so further appends
// through the same writer chain correctly.
//
// When the aggregate keeps snapshots and the new version is at least
// Snapshots.Every events past the newest snapshot, the new state is stored
// in the same transaction, behind a savepoint: it commits with the events or
// not at all, and a snapshot that cannot be written is logged and never
// fails the append.
//
// If a fold fails on the new events, the transaction is aborted (a commit
// rolls back), so no stream is committed into a state its aggregate cannot
// load; the writer is then unusable.
func (w *Writer[S]) Append(ctx context.Context, payloads ...any) (postgres.AppendResult, error) {
	if w.broken != nil {
		return postgres.AppendResult{}, fmt.Errorf("append to stream %s: writer unusable after an earlier failure: %w", w.cur.Stream, w.broken)
	}
	res, err := w.repo.store.Append(ctx, w.tx, w.cur.Stream, projector.ExactVersion(w.cur.Version), payloads...)
	if err != nil {
		return postgres.AppendResult{}, err
	}
	next := w.cur
	reg := w.repo.store.Registry()
	for _, ev := range res.Events {
		var err error
		if _, folded := w.repo.folds[ev.Type]; folded {
			ev.Payload, _, err = reg.Decode(ev.Type, ev.SchemaVersion, ev.Data)
		}
		if err == nil {
			err = w.repo.apply(&next, ev)
		}
		if err != nil {
			w.broken = err
			_, _ = w.tx.Exec(context.WithoutCancel(ctx), abortSQL)
			return postgres.AppendResult{}, fmt.Errorf("append to stream %s: the events were written but cannot be folded, so the transaction was aborted: %w", w.cur.Stream, err)
		}
	}
	w.cur = next
	if r := w.repo; r.snapshotting() && w.cur.Version-w.snapAt >= r.snap.Every {
		if r.writeSnapshot(ctx, w.tx, w.cur, res.Events[len(res.Events)-1].RecordedAt) {
			w.snapAt = w.cur.Version
		}
	}
	return res, nil
}

// abortSQL raises an error inside the transaction: the portable way to
// mark it failed from the client without ending it.
const abortSQL = `DO $$BEGIN RAISE EXCEPTION 'projector: appended events cannot be folded by their aggregate; the transaction is aborted and must be rolled back'; END$$`

// AssertVersion makes the writer's version hold until the transaction ends,
// for a transaction that decides on the aggregate's state but writes
// elsewhere, appending nothing (or before it appends). It locks the stream
// in share mode (see [postgres.Store.LockStream]) and compares its version
// with the writer's:
//
//   - if another transaction appended since the fetch, it fails with a
//     [*projector.ConcurrencyError]: roll back and retry;
//   - otherwise the stream stays at that version until this transaction
//     ends: appends by other transactions (and exclusive fetches) wait for
//     it to commit or roll back, so everything it commits was decided on the
//     state it read.
//
// Call it last, just before commit, to hold the lock for the shortest time;
// calling it early holds the state for the whole transaction. Several
// transactions may hold the same stream this way at once. If two of them then
// append to it, one of them is refused as a deadlock, which surfaces as the
// retryable concurrency error after PostgreSQL's deadlock_timeout: append
// first, or fetch exclusively, when you mean to write the stream.
//
// For a stream that does not exist (version 0) the check is that it still
// does not exist, and only exclusive writers are held back until commit: a
// plain append creating the stream is not.
func (w *Writer[S]) AssertVersion(ctx context.Context) error {
	if w.broken != nil {
		return fmt.Errorf("assert version of stream %s: writer unusable after an earlier failure: %w", w.cur.Stream, w.broken)
	}
	v, err := w.repo.store.LockStream(ctx, w.tx, w.cur.Stream, postgres.LockOptions{Shared: true})
	if err != nil {
		return fmt.Errorf("assert version of stream %s: %w", w.cur.Stream, err)
	}
	if v != w.cur.Version {
		return fmt.Errorf("assert version of stream %s: %w", w.cur.Stream, &projector.ConcurrencyError{
			Stream: w.cur.Stream, Expected: projector.ExactVersion(w.cur.Version), Actual: v,
			Reason: "another transaction appended after the aggregate was fetched",
		})
	}
	return nil
}
