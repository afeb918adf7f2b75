package cli

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/spf13/cobra"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

// textFlags refuses (exit 2), naming the flag, a value of one of the named
// string flags that PostgreSQL text cannot hold (invalid UTF-8, a NUL): the
// library's error names its filter's field, not the flag that was typed.
func textFlags(cmd *cobra.Command, flags ...string) error {
	for _, name := range flags {
		fl := cmd.Flags().Lookup(name)
		if fl == nil {
			continue
		}
		v := fl.Value.String()
		if err := projector.ValidText(v); err != nil {
			return usageError{fmt.Errorf("--%s %s %w", name, projector.Printable(v), err)}
		}
	}
	return nil
}

// knownConsumer checks a list's --consumer filter once the list came back
// empty: a name that is neither registered nor found in table (the
// consumer column of projector_parks or projector_dead_letters) is a
// usage error (exit 2) listing the registered consumers, as `consumer
// status` does, where "no parks match" read as if the typo were a
// consumer with nothing parked. A removed consumer's parks and dead
// letters stay listable under its name: they are kept after the removal.
func knownConsumer(ctx context.Context, store *postgres.Store, consumer, table string) error {
	if consumer == "" {
		return nil
	}
	admin := projection.NewAdmin(store)
	shards, err := admin.List(ctx, consumer)
	if err != nil {
		return err
	}
	if len(shards) > 0 {
		return nil
	}
	var found bool
	if err := store.Pool().QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+store.Table(table)+` WHERE consumer = $1)`, consumer).Scan(&found); err != nil {
		return fmt.Errorf("look up consumer %s: %w", projector.Printable(consumer), err)
	}
	if found {
		return nil
	}
	// The registered consumers, for the message, read once: a consumer
	// registered since the first look is known after all (not a consumer
	// "with shards for instances" to choose from, as it would read).
	all, err := admin.List(ctx, "")
	if err != nil {
		return err
	}
	if slices.ContainsFunc(all, func(s projection.ShardState) bool { return s.Consumer == consumer }) {
		return nil
	}
	return unknownConsumerIn(all, consumer, fmt.Errorf("--consumer %s: %w", projector.Printable(consumer), projector.ErrNotFound))
}

// notFoundHint adds to a not-found error (exit 1, as for every id that
// names nothing) the command that lists what exists.
func notFoundHint(cmd *cobra.Command, err error, list string) error {
	if !errors.Is(err, projector.ErrNotFound) {
		return err
	}
	return fmt.Errorf("%w (`%s %s --status all` lists them)", err, cmd.Root().Name(), list)
}

// parkNotFound is notFoundHint for a park id.
func parkNotFound(cmd *cobra.Command, err error) error { return notFoundHint(cmd, err, "parked list") }

// deadLetterNotFound is notFoundHint for a dead-letter id.
func deadLetterNotFound(cmd *cobra.Command, err error) error {
	return notFoundHint(cmd, err, "dead-letters list")
}
