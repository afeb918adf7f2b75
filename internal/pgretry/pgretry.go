// Package pgretry runs an operator's retry again when PostgreSQL aborted
// its transaction for a reason that says nothing about what was retried: a
// deadlock, a serialization failure, a lost connection.
package pgretry

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// Tries bounds how often Do runs a try that a conflict aborted.
const Tries = 5

// Conflict reports whether err is PostgreSQL's answer to a conflict with
// another transaction: a serialization failure or a deadlock (SQLSTATE
// class 40). The transaction committed nothing, and the same work may well
// go through when tried again.
func Conflict(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && strings.HasPrefix(pgErr.Code, "40")
}

// ConnectionLoss reports whether err is a failure of the connection
// itself: a failure to connect, a connection exception (08…) or an
// operator's intervention (57P…: a terminated backend, a server shutting
// down). The transaction it struck is gone; on a new connection the same
// work may well succeed.
func ConnectionLoss(err error) bool {
	if err == nil {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return strings.HasPrefix(pgErr.Code, "08") || strings.HasPrefix(pgErr.Code, "57P")
	}
	return errors.As(err, new(*pgconn.ConnectError))
}

// Retryable reports whether err aborted a transaction for a reason that
// says nothing about the work it did: a Conflict or a ConnectionLoss. Do
// takes it as its retryable for an operator's retry.
func Retryable(err error) bool {
	return Conflict(err) || ConnectionLoss(err)
}

// Do runs try until it returns an error retryable does not take (nil
// included), Tries times at most, waiting 50 ms, 100 ms, 200 ms… between
// tries. Each try must be a transaction of its own that commits nothing
// when it returns a retryable error, so trying again cannot apply anything
// twice. After the last try the conflict is returned, wrapped with what
// (the operation's name) and the words "nothing recorded".
func Do(ctx context.Context, what string, retryable func(error) bool, try func() error) error {
	wait := 50 * time.Millisecond
	for n := 1; ; n++ {
		err := try()
		if err == nil || !retryable(err) {
			return err
		}
		if n == Tries {
			return fmt.Errorf("%s: aborted by a conflict %d times, nothing recorded (try again): %w", what, n, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: aborted by a conflict, nothing recorded: %w", what, errors.Join(err, ctx.Err()))
		case <-time.After(wait):
		}
		wait *= 2
	}
}
