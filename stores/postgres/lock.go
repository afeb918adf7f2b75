package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/projectorhq/projector"
)

// ErrLocked means a stream lock was asked for without waiting
// ([LockOptions].NoWait) while another transaction held it. It is not
// [projector.ErrConcurrency]: nothing changed, the stream is only busy, and
// retrying at once would most likely fail the same way. Roll the transaction
// back; any lock it did take is released with it.
var ErrLocked = errors.New("projector: stream is locked by another transaction")

// LockOptions says how [Store.LockStream] locks. The zero value takes an
// exclusive lock and waits for it.
type LockOptions struct {
	// Shared takes the lock in share mode: several transactions may hold it
	// at once, and appends and exclusive locks wait until every holder
	// ends. Without it the lock is exclusive: appends, shared and other
	// exclusive locks all wait.
	Shared bool
	// NoWait fails with [ErrLocked] at once instead of waiting for another
	// transaction's lock.
	NoWait bool
}

// Lock statements. The advisory lock is keyed on the stream, so locking a
// stream that does not exist yet still makes other lockers of it wait; the
// row lock on the stream head is what makes plain appends (which update that
// row) wait too. Both are transaction-scoped: they end with the transaction.
const (
	lockAdvisorySQL          = `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`
	lockAdvisorySharedSQL    = `SELECT pg_advisory_xact_lock_shared(hashtextextended($1, 0))`
	tryAdvisorySQL           = `SELECT pg_try_advisory_xact_lock(hashtextextended($1, 0))`
	tryAdvisorySharedSQL     = `SELECT pg_try_advisory_xact_lock_shared(hashtextextended($1, 0))`
	lockHeadSQL              = `SELECT version FROM %s WHERE tenant_id = $1 AND stream_type = $2 AND stream_id = $3 FOR %s`
	streamLockKeyPrefix      = "projector.stream:"
	streamLockKeySeparator   = "\x1f"
	sqlstateLockNotAvailable = "55P03"
)

// StreamLockKey is the text whose hashtextextended(…, 0) keys the advisory
// lock [Store.LockStream] takes on stream, so an operator can find the lock
// in pg_locks: the prefix "projector.stream:", then schema, tenant, type and
// id separated by the control character U+001F.
func (s *Store) StreamLockKey(stream projector.StreamRef) string {
	sep := streamLockKeySeparator
	return streamLockKeyPrefix + s.schema + sep + stream.Tenant + sep + stream.Type + sep + stream.ID
}

// LockStream locks stream inside tx until tx commits or rolls back, and
// returns the stream's version as of the lock (0 when the stream does not
// exist yet). It is the primitive under exclusive writing and under
// asserting a version without appending.
//
// It takes two locks, in one round trip and always in this order: a
// transaction-scoped advisory lock keyed on the stream (see
// [Store.StreamLockKey]), then a row lock on the stream's head (FOR UPDATE,
// or FOR SHARE when opts.Shared). The advisory lock is what makes two
// lockers of a stream that does not exist yet take turns (there is no row to
// lock); the row lock is what makes a plain [Store.Append] to an existing
// stream wait, since an append updates that row. A plain append that creates
// a stream is not held back by the advisory lock: a locker of a new stream
// learns of it when its own append fails the version check.
//
// Because the advisory lock is taken first and takes no transaction id, a
// transaction that locks before it writes anything gets its id only after the
// previous holder has finished, which keeps exclusive writers clear of the
// older-transaction refusal of promise 4 (a transaction that already wrote
// elsewhere can still meet it, as with any append).
//
// Read committed isolation is assumed: the version is read after the locks
// are granted, so it includes what the previous holder committed. Under
// repeatable read a stream changed since the transaction's snapshot fails
// with a [*projector.ConcurrencyError].
//
// With opts.NoWait a lock held elsewhere fails with [ErrLocked]; a deadlock
// or serialization failure is a [*projector.ConcurrencyError] (retryable).
func (s *Store) LockStream(ctx context.Context, tx pgx.Tx, stream projector.StreamRef, opts LockOptions) (int64, error) {
	v, err := s.lockStream(ctx, tx, stream, opts)
	if err != nil {
		return 0, fmt.Errorf("lock stream %s: %w", stream, err)
	}
	return v, nil
}

func (s *Store) lockStream(ctx context.Context, tx pgx.Tx, stream projector.StreamRef, opts LockOptions) (int64, error) {
	if tx == nil {
		return 0, errors.New("nil transaction: a stream lock lives as long as the caller's transaction")
	}
	if err := stream.Validate(); err != nil {
		return 0, err
	}
	var advisory string
	switch {
	case opts.Shared && opts.NoWait:
		advisory = tryAdvisorySharedSQL
	case opts.Shared:
		advisory = lockAdvisorySharedSQL
	case opts.NoWait:
		advisory = tryAdvisorySQL
	default:
		advisory = lockAdvisorySQL
	}
	mode := "UPDATE"
	if opts.Shared {
		mode = "SHARE"
	}
	if opts.NoWait {
		mode += " NOWAIT"
	}
	b := &pgx.Batch{}
	b.Queue(advisory, s.StreamLockKey(stream))
	b.Queue(fmt.Sprintf(lockHeadSQL, s.Table("projector_streams"), mode), stream.Tenant, stream.Type, stream.ID)
	br := tx.SendBatch(ctx, b)
	defer func() { _ = br.Close() }()

	if opts.NoWait {
		var got bool
		if err := br.QueryRow().Scan(&got); err != nil {
			return 0, mapLockError(stream, err)
		}
		if !got {
			return 0, ErrLocked
		}
	} else if _, err := br.Exec(); err != nil {
		return 0, mapLockError(stream, err)
	}
	var version int64
	err := br.QueryRow().Scan(&version)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, mapLockError(stream, err)
	}
	if err := br.Close(); err != nil {
		return 0, mapLockError(stream, err)
	}
	return version, nil
}

// mapLockError turns a lock that was not available into [ErrLocked] and
// deadlocks and serialization failures into the retryable concurrency error.
func mapLockError(stream projector.StreamRef, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case sqlstateLockNotAvailable:
			return fmt.Errorf("%w (%s)", ErrLocked, pgErr.Code)
		case "40001", "40P01":
			return concurrencyFrom(&projector.ConcurrencyError{Stream: stream, Expected: projector.AnyVersion, Actual: -1, Reason: pgErr.Message}, pgErr)
		}
	}
	return err
}
