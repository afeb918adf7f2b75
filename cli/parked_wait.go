package cli

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

// checkParkWait range-checks `parked retry`'s --wait and --timeout: a
// usage error (exit 2) for a timeout out of bounds, --timeout without
// --wait, or --wait with --here (which applies the sequence before it
// returns: there is nothing to wait for).
func checkParkWait(cmd *cobra.Command, here, wait bool, timeout time.Duration) error {
	switch {
	case here && wait:
		return usageError{errors.New("--wait with --here: --here applies the sequence in this process before it returns; drop --wait")}
	case !wait && cmd.Flags().Changed("timeout"):
		return usageError{errors.New("--timeout bounds --wait: add --wait, or drop --timeout")}
	case timeout < minParkWait || timeout > maxParkWait:
		return usageError{fmt.Errorf("--timeout %v: want %v to %v", timeout, minParkWait, maxParkWait)}
	}
	return nil
}

// retryParkAndWait requests a retry of park id on behalf of by and follows
// the park, every parkWaitPoll for at most timeout, until a dispatcher has
// carried the request out: resolved (nil), failed and parked again (an
// error, exit 1, with the retry's error), or discarded meanwhile by
// another operator (a refusal, exit 3). Running out of time is an error
// (exit 1) that says the request stays.
func (a *App) retryParkAndWait(cmd *cobra.Command, store *postgres.Store, id int64, by string, timeout time.Duration) error {
	ctx := cmd.Context()
	if err := projection.RequestParkRetry(ctx, store, id, by); err != nil {
		return err
	}
	// The park alone: its events would be decoded with this binary's
	// registry, which the stock binary's lacks — the request, recorded,
	// was then reported failed (exit 1).
	p, err := projection.ParkByID(ctx, store, id)
	if err != nil {
		return err
	}
	fmt.Fprintf(a.out, "retry of park %d requested; waiting up to %v for a running dispatcher with consumer %s to carry it out\n",
		id, timeout, projector.Printable(p.Consumer))
	waitCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	err = poll(waitCtx, parkWaitPoll, func() (bool, error) {
		seen, err := projection.ParkByID(waitCtx, store, id)
		if err != nil {
			return false, err
		}
		p = seen
		return p.Status != projection.ParkOpen || p.RetryRequestedAt == nil, nil
	})
	root := cmd.Root().Name()
	switch {
	case errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil:
		return fmt.Errorf("park %d: no dispatcher carried out the retry within %v; the request stays: start one with consumer %s (`%s run`, in your application's binary), follow it with `%s parked show %d`, or retry with --here in that binary",
			id, timeout, projector.Printable(p.Consumer), root, root, id)
	case err != nil:
		return fmt.Errorf("park %d: stopped waiting (the request stays; follow it with `%s parked show %d`): %w", id, root, id, err)
	case p.Status == projection.ParkResolved:
		fmt.Fprintf(a.out, "park %d: a dispatcher applied its %d events in order and resolved it; %s is live again\n", id, p.Events, parkStream(p))
		return nil
	case p.Status == projection.ParkDiscarded:
		return refusedError{fmt.Errorf("park %d: discarded meanwhile by %s; its events are never applied", id, projector.Printable(p.ResolvedBy))}
	}
	return fmt.Errorf("park %d: retry failed (attempt %d), nothing applied, still parked: %s", id, p.Attempts, text(p.Error, lineText))
}
