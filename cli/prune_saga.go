package cli

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/projectorhq/projector/saga"
	"github.com/projectorhq/projector/stores/postgres"
)

// DefaultSagaRetention is how long `events prune` keeps a completed saga
// instance (its state and steps, for `saga show`) by default: long enough
// to answer "why did this ticket escalate" about last month.
const DefaultSagaRetention = "30d"

// parseSagaRetention reads --saga-retention: "0" keeps completed instances,
// anything else is an age as --older-than takes it.
func parseSagaRetention(s string) (time.Duration, error) {
	if s == "0" {
		return 0, nil
	}
	d, err := parseAge(s)
	if err != nil {
		return 0, fmt.Errorf("%w (or 0 to keep completed instances)", err)
	}
	return d, nil
}

// pruneSagas is the saga part of `events prune`: it deletes (or, on a dry
// run, counts) the instances that completed more than age ago. An age of
// zero keeps them all.
func (a *App) pruneSagas(cmd *cobra.Command, store *postgres.Store, age time.Duration, flag string, dryRun bool) error {
	if age == 0 {
		return nil
	}
	prune, verb := saga.PruneCompleted, "deleted"
	if dryRun {
		prune, verb = saga.CountCompleted, "would delete"
	}
	n, err := prune(cmd.Context(), store, age)
	if err != nil {
		return err
	}
	fmt.Fprintf(a.out, "%s %d saga %s completed more than %s ago (--saga-retention)\n", verb, n, plural(n, "instance"), flag)
	return nil
}
