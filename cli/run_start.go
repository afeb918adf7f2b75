package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/projectorhq/projector/stores/postgres"
)

// DefaultStartRetry is how long `run` keeps retrying a start-up whose
// connection failed, unless --start-retry says otherwise.
const DefaultStartRetry = time.Minute

// maxStartRetry bounds --start-retry.
const maxStartRetry = time.Hour

// openForRun connects, sets up the application's tables and opens the
// store, as `run` starts. A failure of the connection (refused, terminated,
// the server starting or shutting down) is retried with logged backoff for
// up to retry: a daemon started beside a database that is restarting, or
// whose first backend an operator terminated, should come up, not exit. A
// failure a retry cannot mend (a refused login, a missing database, pending
// migrations, a bad command line) is returned at once, and so is the
// context's end.
func (a *App) openForRun(ctx context.Context, w Wiring, retry time.Duration, log *slog.Logger) (*pgxpool.Pool, *postgres.Store, error) {
	deadline := time.Now().Add(retry)
	for attempt := 1; ; attempt++ {
		pool, store, err := a.openOnce(ctx, w)
		if err == nil {
			return pool, store, nil
		}
		wait := startBackoff(attempt)
		if ctx.Err() != nil || !retryableStart(err) || time.Now().Add(wait).After(deadline) {
			return nil, nil, err
		}
		log.WarnContext(ctx, "run: start-up failed; retrying", slog.Int("attempt", attempt), slog.Any("error", err),
			slog.Duration("retry_in", wait), slog.Time("gives_up_at", deadline))
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil, nil, ctx.Err()
		case <-timer.C:
		}
	}
}

// openOnce is one attempt of openForRun.
func (a *App) openOnce(ctx context.Context, w Wiring) (*pgxpool.Pool, *postgres.Store, error) {
	pool, err := a.Pool(ctx)
	if err != nil {
		return nil, nil, err
	}
	ok := false
	defer func() {
		if !ok {
			pool.Close()
		}
	}()
	if len(w.Async) == 0 && w.Sagas == nil && len(rebuildableInline(w)) == 0 {
		return nil, nil, errNothingToRun
	}
	if w.Setup != nil {
		if err := w.Setup(ctx, pool); err != nil {
			return nil, nil, fmt.Errorf("set up the application's tables: %w", err)
		}
	}
	a.appends = true // sagas append: the store notes a recorded inline projection this binary lacks
	store, err := a.Store(ctx, pool)
	if err != nil {
		return nil, nil, err
	}
	ok = true
	return pool, store, nil
}

// startBackoff is the wait after the n-th failed start-up: 500ms doubling
// to 10s, with jitter.
func startBackoff(n int) time.Duration {
	d := 500 * time.Millisecond
	for i := 1; i < n && d < 10*time.Second; i++ {
		d *= 2
	}
	d = min(d, 10*time.Second)
	return time.Duration(float64(d) * (0.75 + 0.5*rand.Float64()))
}

// retryableStart reports whether a start-up failure is of the connection,
// which a later attempt may not meet: a server error of the connection
// (08…), operator-intervention (57P…: terminated, shutting down, starting
// up) or too-many-connections (53300) class, a failure to connect that the
// server did not answer, or a connection that broke mid-statement.
func retryableStart(err error) bool {
	if errors.As(err, new(usageError)) || errors.Is(err, postgres.ErrSchemaOutdated) || errors.Is(err, errNothingToRun) {
		return false
	}
	// A server answer decides on its own: inside a connect error it may be
	// a refused login or a missing database, which no retry mends.
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		c := pgErr.Code
		return strings.HasPrefix(c, "08") || strings.HasPrefix(c, "57P") || c == "53300"
	}
	var netErr net.Error
	return errors.As(err, new(*pgconn.ConnectError)) || errors.As(err, &netErr) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || pgconn.SafeToRetry(err) ||
		strings.Contains(err.Error(), "conn closed")
}
