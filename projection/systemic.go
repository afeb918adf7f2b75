package projection

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgretry"
)

// ErrSystemic marks a failure that is not about one event: a missing table
// or column, a missing grant, a lost connection, a server shutting down. Every
// event behind the failing one would fail the same way, so dead-lettering it
// and going on would only fill the dead-letter table with healthy events.
// A dispatcher shard whose handler fails with such an error stops at once
// (dead, in either error mode, nothing dead-lettered), and so does a
// JetStream claims consumer; an operator fixes the cause and restarts it.
//
// A handler may wrap ErrSystemic itself to say that a failure of its own
// (an outside service that is down for everyone) is systemic:
//
//	return fmt.Errorf("%w: search backend unreachable: %w", projection.ErrSystemic, err)
var ErrSystemic = errors.New("projection: systemic failure, not about one event")

// systemicCodes lists the SQLSTATE classes (two characters) and codes (five)
// that say nothing about the event being handled: the schema, the grants,
// the connection or the server is wrong, so every event would fail alike.
// Data errors (22…, 23…), serialization failures and deadlocks (40…) and
// statement timeouts (57014) are about the event or the moment, and are
// not listed. Keep docs/projections.md (Errors) in step with this list.
var systemicCodes = []string{
	"08",    // connection exception
	"28",    // invalid authorization specification
	"3D000", // invalid catalog name: the database does not exist
	"3F000", // invalid schema name
	"25006", // read-only SQL transaction: connected to a standby
	"42501", // insufficient privilege (but see rowRefused)
	"42P01", // undefined table
	"42703", // undefined column
	"42704", // undefined object (type, role…)
	"42883", // undefined function
	"53",    // insufficient resources: disk full, out of memory, too many connections
	"57P",   // operator intervention: admin or crash shutdown, cannot connect now, database dropped
	"58",    // system error: I/O error
	"XX",    // internal error, data or index corrupted
}

// IsSystemic reports whether err is a failure that is not about one event:
// it wraps [ErrSystemic], a PostgreSQL error whose SQLSTATE is in the
// documented list (docs/projections.md, Errors), or a failure to connect.
// The dispatcher and the JetStream claims consumer both decide with it.
func IsSystemic(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, ErrSystemic) {
		return true
	}
	if ce := (*pgconn.ConnectError)(nil); errors.As(err, &ce) {
		return true
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	return SystemicCode(pgErr.Code) && !rowRefused(pgErr)
}

// rowRefused reports a row-level-security refusal of one row: SQLSTATE
// 42501 like a missing grant, but about the event (a tenant's event
// writing another tenant's row), so it follows the error mode. PostgreSQL
// raises it in ExecWithCheckOptions; the routine name, unlike the message,
// does not depend on the server's language.
func rowRefused(e *pgconn.PgError) bool {
	return e.Code == "42501" && e.Routine == "ExecWithCheckOptions"
}

// IsConnectionLoss reports whether err is a systemic failure of the
// connection itself: a failure to connect, a connection exception (08…) or
// an operator's intervention (57P…: a terminated backend, a server shutting
// down). The transaction it struck is gone, and a retry on a new connection
// may well succeed: the dispatcher retries such a pass with backoff, and the
// JetStream claims consumer leaves the message for redelivery and goes on,
// where a missing table or grant stops them.
func IsConnectionLoss(err error) bool { return pgretry.ConnectionLoss(err) }

// SystemicCode reports whether a SQLSTATE code is one [IsSystemic] treats
// as not about one event.
func SystemicCode(code string) bool {
	if len(code) != 5 {
		return false
	}
	for _, c := range systemicCodes {
		if strings.HasPrefix(code, c) {
			return true
		}
	}
	return false
}

// retryLater reports whether a dispatcher carrying out an operator's
// retry request (of a dead letter, of a park) should leave the request
// for its next look rather than clear it: the retry's transaction lost a
// conflict with another (a serialization failure or a deadlock, SQLSTATE
// class 40) or its connection (IsConnectionLoss), so nothing of it
// committed and the same retry may well go through on the next look.
// Any other failure clears the request, so one that cannot be carried out
// is not tried on every look.
func retryLater(err error) bool {
	return pgretry.Retryable(err)
}

// handlerRetryLater is retryLater for a handler's failure inside a retry:
// a handler statement that was a deadlock's victim, lost a serialization
// conflict or its connection says nothing about the event, so the retry
// returns it as the transaction's error (nothing commits: a requested
// retry's request stays, a direct one is tried again by retryConflicts)
// instead of recording it as the retry's outcome, which counted an attempt,
// and cleared the request or told the operator the event had failed.
func handlerRetryLater(herr error) bool {
	return herr != nil && retryLater(herr)
}

// retryNotAboutEvent returns the error a retry of what ("dead letter 5",
// "park 3") ends its transaction with when its handler's failure herr says
// nothing about the event, so that nothing is recorded; nil when herr is
// the retry's outcome to record (nil too: applied). Two kinds:
//
//   - lost a conflict or the connection (handlerRetryLater): tried again,
//     a requested retry's request stays;
//   - a direct retry's (RetryDeadLetter, RetryPark) systemic failure
//     ([IsSystemic]: a missing table or grant, a server out of disk): no
//     attempt counted and the dead letter's or park's error left as it
//     was, since the same failure would strike any event, as it stops a
//     live pass rather than failing its event. The caller sees it
//     (IsSystemic holds for the result), and a bulk retry stops at it. A
//     retry a dispatcher carries out for an operator's request still
//     records it, where that operator reads the outcome.
func retryNotAboutEvent(what string, herr error, requested bool) error {
	switch {
	case handlerRetryLater(herr):
		return fmt.Errorf("retry %s: %w", what, herr)
	case !requested && IsSystemic(herr):
		return fmt.Errorf("retry %s: the handler failed for a reason not about the event (nothing recorded, no attempt counted): %w", what, herr)
	}
	return nil
}

// handlerLostConflict reports whether a handler's failure is its
// transaction losing a conflict with another (SQLSTATE class 40: a
// deadlock's victim, a serialization failure): nothing about the event,
// and the same pass will very likely go through once the other transaction
// has finished. Live passes and replays never count it as the event's
// failure: they roll back and run again (conflictError).
func handlerLostConflict(herr error) bool {
	return herr != nil && pgretry.Conflict(herr)
}

// conflictError ends a pass or a replay whose handler lost a conflict
// (handlerLostConflict): the transaction is rolled back with nothing
// recorded against the event (no attempt, dead letter or park), and the
// dispatcher runs the pass again after its backoff. It unwraps to the
// PostgreSQL error, so pgretry.Conflict still tells it.
type conflictError struct {
	event projector.Event
	err   error
}

func (e *conflictError) Error() string {
	return fmt.Sprintf("handler of event %s (%s) lost a conflict with another transaction; rolled back, nothing recorded against the event, to be run again: %v",
		e.event.ID, projector.Printable(e.event.Type), e.err)
}

func (e *conflictError) Unwrap() error { return e.err }

// retryConflicts runs a direct (operator's, in-process) retry again, as
// a dispatcher carrying out a request tries again on its next look, when a
// conflict or a lost connection aborted it (retryLater): pgretry.Do.
func retryConflicts(ctx context.Context, what string, try func() error) error {
	return pgretry.Do(ctx, what, retryLater, try)
}

// sqlState returns err's SQLSTATE, or "" when it carries none.
func sqlState(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// dbBackoff is the wait after n consecutive database failures (connection
// lost, server restarting): 100ms doubling to 30s, with jitter.
func dbBackoff(n int) time.Duration {
	d := 100 * time.Millisecond
	for i := 1; i < n && d < 30*time.Second; i++ {
		d *= 2
	}
	d = min(d, 30*time.Second)
	return time.Duration(float64(d) * (0.75 + 0.5*rand.Float64()))
}
