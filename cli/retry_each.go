package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/projectorhq/projector/projection"
)

// retryEach retries the items ids name (noun: "dead letter"), one by one,
// in order, with retry, which prints the line of an item it retried: applied
// and resolved (nil), or retried and failed again (again true; the failure
// is recorded on the item, which stays open; err, if set, is kept for
// errors.As). An error about one item (resolved, discarded or gone
// meanwhile, a retry aborted by conflicts, its consumer not wired in this
// binary) is printed on a line of its own, "<noun> N: not retried: <error>",
// and the next item is tried: one item another operator closed, or one
// that keeps losing a deadlock, must not leave every item after it
// unretried, with nothing saying how far the command got.
//
// It stops early only when ctx is done (Ctrl-C) or on a failure every later
// item would meet alike (stopsAll: the database, its schema or grants, the
// connection, or the binary's wiring), and then says how many it tried and
// how many it left untried. Whatever did not end resolved makes its error a
// [*retrySummary], which counts what happened and wraps every item's error,
// so the exit code is theirs ([ExitCode]: 2 if one names a consumer this
// binary lacks, 3 if one was refused, else 1).
func retryEach(ctx context.Context, w io.Writer, noun string, ids []int64, retry func(id int64) (again bool, err error)) error {
	s := &retrySummary{noun: noun, total: len(ids)}
	for i, id := range ids {
		if err := ctx.Err(); err != nil {
			s.stop(w, i, err, "interrupted", "")
			break
		}
		again, err := retry(id)
		switch {
		case again:
			s.again++
			if err != nil {
				s.kept = append(s.kept, err)
			}
			continue
		case err == nil:
			s.resolved++
			continue
		}
		fmt.Fprintf(w, "%s %d: not retried: %s\n", noun, id, text(message(err), lineText))
		s.failed = append(s.failed, err)
		switch {
		case ctx.Err() != nil:
			s.stop(w, i+1, nil, "interrupted", "")
		case stopsAll(err):
			s.stop(w, i+1, nil, fmt.Sprintf("stopped at the failure of %s %d", noun, id),
				fmt.Sprintf("; that failure is not about one %s, so every one after it would fail alike", noun))
		default:
			continue
		}
		break
	}
	if s.resolved == s.total {
		return nil
	}
	return s
}

// stopsAll reports whether a bulk retry's failure of one item is not about
// that item: [projection.IsSystemic] (a missing table or grant, a lost
// connection), or a failure of this binary's wiring ([wiringError]).
func stopsAll(err error) bool {
	var we wiringError
	return projection.IsSystemic(err) || errors.As(err, &we)
}

// wiringError marks a failure to build this binary's consumers
// (cli.Config.Wire): a bulk retry stops at it, as every item would meet it.
type wiringError struct{ error }

func (e wiringError) Unwrap() error { return e.error }

// retrySummary is the error of a bulk retry that did not resolve every
// item: how many of how many were resolved, failed again, were left
// untried (and why), and could not be retried (with each one's error,
// separated: the CLI prints the error on one line).
type retrySummary struct {
	noun                            string
	total, resolved, again, untried int
	// why is why the items left untried were: "interrupted", or at which
	// item's failure the command stopped.
	why string
	// failed are the errors of the items that could not be retried, kept
	// is those of items that failed again, and cause, if set, the
	// context's error that stopped the command between two items: all are
	// wrapped, for errors.Is and errors.As (the exit code).
	failed, kept []error
	cause        error
}

// stop records that the command stopped before the item at index next of
// the ids, for why (cause: the context's error, when no item's error says
// it), and prints how far it got, then detail.
func (s *retrySummary) stop(w io.Writer, next int, cause error, why, detail string) {
	s.untried, s.cause, s.why = s.total-next, cause, why
	if s.untried == 0 {
		return
	}
	fmt.Fprintf(w, "%s: %d of %d %s tried (%d resolved), %d left untried%s\n",
		why, next, s.total, plural(int64(s.total), s.noun), s.resolved, s.untried, detail)
}

func (s *retrySummary) Error() string {
	parts := []string{fmt.Sprintf("%d of %d %s resolved", s.resolved, s.total, plural(int64(s.total), s.noun))}
	if s.again > 0 {
		parts = append(parts, fmt.Sprintf("%d failed again (still open, with the new %s)", s.again, plural(int64(s.again), "error")))
	}
	if s.untried > 0 {
		parts = append(parts, fmt.Sprintf("%d left untried (%s)", s.untried, s.why))
	}
	if len(s.failed) > 0 {
		msgs := make([]string, len(s.failed))
		for i, err := range s.failed {
			msgs[i] = err.Error()
		}
		parts = append(parts, fmt.Sprintf("%d could not be retried: %s", len(s.failed), strings.Join(msgs, "; ")))
	}
	return strings.Join(parts, "; ")
}

func (s *retrySummary) Unwrap() []error {
	errs := append(append([]error{}, s.failed...), s.kept...)
	if s.cause != nil {
		errs = append(errs, s.cause)
	}
	return errs
}
