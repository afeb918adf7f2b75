package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/projection"
)

// retryEach goes on past an item's own failure (a refusal, a failed-again
// retry) and stops at one that is not about the item (projection
// .IsSystemic, or this binary's wiring): every later item would fail
// alike. It says how far it got, and its error counts each outcome and
// keeps each item's error for the exit code.
func TestRetryEachStopsAtASystemicFailure(t *testing.T) {
	t.Parallel()
	refused := fmt.Errorf("retry dead letter 2: it is resolved already: %w", projector.ErrInvalidTransition)
	for _, stop := range []error{
		fmt.Errorf("retry dead letter 4: %w: disk full", projection.ErrSystemic),
		wiringError{errors.New("wire sagas: no config")},
	} {
		var out strings.Builder
		var tried []int64
		err := retryEach(context.Background(), &out, "dead letter", []int64{1, 2, 3, 4, 5, 6}, func(id int64) (bool, error) {
			tried = append(tried, id)
			switch id {
			case 2:
				return false, refused
			case 3:
				return true, nil
			case 4:
				return false, stop
			}
			return false, nil
		})
		if fmt.Sprint(tried) != "[1 2 3 4]" {
			t.Errorf("%v: tried %v, want 1 to 4", stop, tried)
		}
		for _, want := range []string{
			"dead letter 2: not retried: retry dead letter 2: it is resolved already: invalid state transition\n",
			"dead letter 4: not retried: " + stop.Error() + "\n",
			"stopped at the failure of dead letter 4: 4 of 6 dead letters tried (1 resolved), 2 left untried; that failure is not about one dead letter",
		} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("%v: output lacks %q:\n%s", stop, want, out.String())
			}
		}
		want := "1 of 6 dead letters resolved; 1 failed again (still open, with the new error); 2 left untried (stopped at the failure of dead letter 4); " +
			"2 could not be retried: " + refused.Error() + "; " + stop.Error()
		if err == nil || err.Error() != want || !errors.Is(err, projector.ErrInvalidTransition) || ExitCode(err) != ExitRefused {
			t.Errorf("%v: error %v (exit %d), want %q, exit %d", stop, err, ExitCode(err), want, ExitRefused)
		}
	}
	if err := retryEach(context.Background(), io.Discard, "park", []int64{1, 2}, func(int64) (bool, error) { return false, nil }); err != nil {
		t.Errorf("all resolved: %v", err)
	}
}

// A discard of several dead letters goes on past one it cannot discard
// (refused) and stops at Ctrl-C, or at a failure that is not about one
// dead letter, saying how many it left; before, Ctrl-C let it try every
// remaining id, each failing with the cancelled context.
func TestEachDeadLetterStopsAtCtrlCAndSystemicFailures(t *testing.T) {
	t.Parallel()
	refused := fmt.Errorf("discard dead letter 2: it is resolved already: %w", projector.ErrInvalidTransition)
	t.Run("systemic", func(t *testing.T) {
		var out strings.Builder
		var tried []int64
		stop := fmt.Errorf("discard dead letter 3: %w: permission denied", projection.ErrSystemic)
		err := (&App{out: &out}).eachDeadLetter(context.Background(), []int64{1, 2, 3, 4, 5}, "discarded", "discarded", func(id int64) error {
			tried = append(tried, id)
			switch id {
			case 2:
				return refused
			case 3:
				return stop
			}
			return nil
		})
		if fmt.Sprint(tried) != "[1 2 3]" || !errors.Is(err, projector.ErrInvalidTransition) || !errors.Is(err, projection.ErrSystemic) {
			t.Errorf("tried %v, error %v; want 1 to 3 and both failures", tried, err)
		}
		if want := "stopped at the failure of dead letter 3, which is not about one dead letter: 3 of 5 dead letters tried, 2 left not discarded\n"; !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	})
	t.Run("ctrl-c", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		var out strings.Builder
		var tried []int64
		err := (&App{out: &out}).eachDeadLetter(ctx, []int64{1, 2, 3, 4, 5}, "discarded", "discarded", func(id int64) error {
			tried = append(tried, id)
			if id == 2 {
				cancel() // the operator's Ctrl-C, after this one went through
			}
			return nil
		})
		if fmt.Sprint(tried) != "[1 2]" || !errors.Is(err, context.Canceled) {
			t.Errorf("tried %v, error %v; want 1 and 2, then context.Canceled", tried, err)
		}
		if want := "interrupted: 2 of 5 dead letters tried, 3 left not discarded\n"; !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	})
}
