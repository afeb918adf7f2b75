package aggregate

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
)

// Defaults of [HandleOptions].
const (
	DefaultMaxAttempts = 5
	DefaultBackoff     = 5 * time.Millisecond
	DefaultMaxBackoff  = 250 * time.Millisecond
)

// Decide is a command's logic: given the aggregate's current state, it
// returns the events to append (payloads of defined event types, in order),
// none when the command changes nothing, or an error to refuse the command.
// It may run more than once for one command (once per attempt, each time on
// fresher state), so it should not have effects of its own outside the
// events it returns.
type Decide[S any] func(ctx context.Context, current Loaded[S]) ([]any, error)

// HandleOptions tunes [Repository.Handle]. The zero value retries up to
// [DefaultMaxAttempts] times with a jittered backoff from [DefaultBackoff]
// to [DefaultMaxBackoff], fetching optimistically.
type HandleOptions struct {
	// MaxAttempts bounds the attempts, the first included; 0 means
	// DefaultMaxAttempts, 1 never retries.
	MaxAttempts int
	// Backoff is the base delay before a retry: before attempt n+1 Handle
	// waits a random duration between 0 and Backoff·2^(n-1), capped at
	// MaxBackoff ("full jitter", so writers that collided spread out).
	// 0 means DefaultBackoff.
	Backoff time.Duration
	// MaxBackoff caps the delay; 0 means DefaultMaxBackoff.
	MaxBackoff time.Duration
	// Exclusive fetches with [Repository.FetchExclusive], so concurrent
	// commands on the stream queue up instead of colliding and retrying:
	// better for a hot stream, one more round trip for a cold one.
	Exclusive bool
}

// Result is what a handled command did.
type Result[S any] struct {
	// Loaded is the aggregate after the command: the state and version
	// including the events appended.
	Loaded[S]
	// Events are the appended events, in order; empty when the command
	// decided nothing needed to change.
	Events []projector.Event
	// Attempts counts the transactions it took, 1 when nothing collided.
	Attempts int
}

// Handle runs one command against stream from start to finish: in a new
// read-committed transaction scoped to the stream's tenant (see
// [postgres.Store.ScopeTx], so inline projections write under row-level
// security), it fetches the aggregate for writing, calls decide, appends the
// events decide returned against the version it read, and commits.
//
// When another writer got there first (any error matching
// [projector.ErrConcurrency], including promise 4's refusal of an older
// transaction, which needs a new transaction) it waits a jittered backoff
// and tries again from the fetch, in a new transaction, up to MaxAttempts
// times; the last error is returned after that. decide may return an error
// matching ErrConcurrency itself to ask for a retry. Any other error, from
// decide or the database, is returned at once and nothing is committed.
//
// decide returning no events is a command that changes nothing: nothing is
// appended, the transaction is rolled back and Handle succeeds with the
// current state.
//
// Handle owns its transactions. To append alongside writes of your own in
// one transaction, use [Repository.FetchForWriting] instead.
func (r *Repository[S]) Handle(ctx context.Context, stream projector.StreamRef, decide Decide[S], opts ...HandleOptions) (Result[S], error) {
	o, err := handleOptions(opts)
	if err == nil && decide == nil {
		err = errors.New("nil decide function")
	}
	if err == nil {
		err = stream.Validate()
	}
	if err != nil {
		return Result[S]{}, fmt.Errorf("handle command on stream %s: %w", stream, err)
	}
	for attempt := 1; ; attempt++ {
		res, err := r.handleOnce(ctx, stream, decide, o.Exclusive)
		if err == nil {
			res.Attempts = attempt
			return res, nil
		}
		if !errors.Is(err, projector.ErrConcurrency) || attempt >= o.MaxAttempts || ctx.Err() != nil {
			if attempt == 1 && !errors.Is(err, projector.ErrConcurrency) {
				// Not a conflict, so never retried: the retry budget in
				// the message read as if it might be.
				return Result[S]{Attempts: attempt}, fmt.Errorf("handle command on stream %s: %w", stream, err)
			}
			return Result[S]{Attempts: attempt}, fmt.Errorf("handle command on stream %s (attempt %d of at most %d): %w", stream, attempt, o.MaxAttempts, err)
		}
		if err := sleep(ctx, backoff(attempt, o.Backoff, o.MaxBackoff)); err != nil {
			return Result[S]{Attempts: attempt}, fmt.Errorf("handle command on stream %s: waiting to retry: %w", stream, err)
		}
	}
}

func handleOptions(opts []HandleOptions) (HandleOptions, error) {
	var o HandleOptions
	switch len(opts) {
	case 0:
	case 1:
		o = opts[0]
	default:
		return o, errors.New("at most one HandleOptions")
	}
	if o.MaxAttempts < 0 || o.Backoff < 0 || o.MaxBackoff < 0 {
		return o, fmt.Errorf("negative HandleOptions (MaxAttempts %d, Backoff %s, MaxBackoff %s)", o.MaxAttempts, o.Backoff, o.MaxBackoff)
	}
	o.MaxAttempts = cmp.Or(o.MaxAttempts, DefaultMaxAttempts)
	o.Backoff = cmp.Or(o.Backoff, DefaultBackoff)
	o.MaxBackoff = max(cmp.Or(o.MaxBackoff, DefaultMaxBackoff), o.Backoff)
	return o, nil
}

func (r *Repository[S]) handleOnce(ctx context.Context, stream projector.StreamRef, decide Decide[S], exclusive bool) (Result[S], error) {
	tx, err := r.store.Pool().BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return Result[S]{}, fmt.Errorf("begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	// A fresh transaction is already unscoped: only a tenant stream needs
	// the round trip that scopes it.
	if stream.Tenant != projector.SystemTenant {
		if err := r.store.ScopeTx(ctx, tx, stream.Tenant); err != nil {
			return Result[S]{}, err
		}
	}
	var w *Writer[S]
	if exclusive {
		w, err = r.FetchExclusive(ctx, tx, stream)
	} else {
		w, err = r.FetchForWriting(ctx, tx, stream)
	}
	if err != nil {
		return Result[S]{}, err
	}
	events, err := decide(ctx, w.Loaded())
	if err != nil {
		return Result[S]{}, fmt.Errorf("decide: %w", err)
	}
	if len(events) == 0 {
		return Result[S]{Loaded: w.Loaded()}, nil
	}
	res, err := w.Append(ctx, events...)
	if err != nil {
		return Result[S]{}, err
	}
	if err := tx.Commit(ctx); err != nil {
		return Result[S]{}, fmt.Errorf("commit: %w", err)
	}
	return Result[S]{Loaded: w.Loaded(), Events: res.Events}, nil
}

// backoff returns the full-jitter delay before the retry after attempt.
func backoff(attempt int, base, ceiling time.Duration) time.Duration {
	d := ceiling
	if shift := attempt - 1; shift < 30 {
		if e := base << shift; e > 0 && e < ceiling {
			d = e
		}
	}
	if d <= 0 {
		return 0
	}
	return rand.N(d + 1)
}

func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
