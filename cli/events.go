package cli

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/stores/postgres"
)

func (a *App) eventsCmd() *cobra.Command {
	root := group("events", "Work on the event log: prune old ephemeral events, follow new ones")
	root.AddCommand(a.pruneCmd(), a.tailCmd())
	return root
}

func (a *App) pruneCmd() *cobra.Command {
	var olderThan string
	var opts postgres.PruneOptions
	cmd := &cobra.Command{
		Use:   "prune --older-than DURATION [--stream-type T ...] [--dry-run]",
		Short: "Delete old events of ephemeral stream types that every consumer has passed",
		Long: `prune deletes events of the given stream types (by default those the application
declares ephemeral) recorded before now minus --older-than, by the database clock.

It never deletes an event that a consumer shard which is not disabled has not passed
yet, and never an event recorded in the dead-letter table. When a consumer holds
events back, prune says which one and how far behind it is; skip its failing event or
disable it if it should not hold retention back.

DURATION is a Go duration (90m, 12h) or a number of days (30d).`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			d, err := parseAge(olderThan)
			if err != nil {
				return usageError{fmt.Errorf("--older-than: %w", err)}
			}
			opts.OlderThan = d
			pool, err := a.Pool(cmd.Context())
			if err != nil {
				return err
			}
			defer pool.Close()
			store, err := a.Store(cmd.Context(), pool)
			if err != nil {
				return err
			}
			if len(opts.StreamTypes) == 0 && len(store.Ephemeral()) == 0 {
				return usageError{fmt.Errorf("no stream types: name them with --stream-type (this application declares none ephemeral)")}
			}
			res, err := store.Prune(cmd.Context(), opts)
			if err != nil {
				return err
			}
			types := opts.StreamTypes
			if len(types) == 0 {
				types = store.Ephemeral()
			}
			verb := "deleted"
			if opts.DryRun {
				verb = "would delete"
			}
			fmt.Fprintf(a.out, "%s %d events of stream types %s recorded before %s\n", verb, res.Deleted,
				strings.Join(types, ", "), res.Cutoff.Local().Format(time.RFC3339))
			fmt.Fprint(a.out, PruneAdvice(a.cfg.Name, res))
			return nil
		},
	}
	cmd.Flags().StringVar(&olderThan, "older-than", "", "minimum age of events to delete, e.g. 720h or 30d (required)")
	cmd.Flags().StringSliceVar(&opts.StreamTypes, "stream-type", nil, "stream type to prune (repeatable; default: the ephemeral types)")
	cmd.Flags().BoolVar(&opts.DryRun, "dry-run", false, "count what would be deleted and held back, delete nothing")
	cmd.Flags().IntVar(&opts.BatchSize, "batch-size", 10_000, "events deleted per transaction")
	_ = cmd.MarkFlagRequired("older-than")
	return cmd
}

// parseAge accepts Go durations and whole days ("30d").
func parseAge(s string) (time.Duration, error) {
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.Atoi(days)
		if err != nil || n <= 0 {
			return 0, fmt.Errorf("%q: want a positive number of days such as 30d", s)
		}
		return time.Duration(n) * 24 * time.Hour, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("%q: want a positive duration such as 720h or 30d", s)
	}
	return d, nil
}

func (a *App) tailCmd() *cobra.Command {
	var types []string
	var limit int
	var fromStart bool
	cmd := &cobra.Command{
		Use:   "tail [--type T ...]",
		Short: "Follow new events live, one line each, until interrupted",
		Long: `tail prints events as they become deliverable, in log order, one line each:
time, type, stream and version, then the JSON payload. It starts at the log's
current horizon (or at the beginning with --from-start) and follows until
interrupted, or until --limit events were printed.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			pool, err := a.Pool(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			store, err := a.Store(ctx, pool)
			if err != nil {
				return err
			}
			after := projector.Start
			if !fromStart {
				if after, err = store.Horizon(ctx); err != nil {
					return err
				}
			}
			return a.follow(ctx, store, after, types, limit)
		},
	}
	cmd.Flags().StringSliceVar(&types, "type", nil, "only events of this type (repeatable)")
	cmd.Flags().IntVar(&limit, "limit", 0, "exit after printing this many events (0: follow until interrupted)")
	cmd.Flags().BoolVar(&fromStart, "from-start", false, "print the log from its beginning first")
	return cmd
}

// follow prints events after the cursor as they arrive, polling while idle.
func (a *App) follow(ctx context.Context, store *postgres.Store, after projector.Position, types []string, limit int) error {
	printed := 0
	idle := 10 * time.Millisecond
	for {
		b, err := store.ReadLog(ctx, postgres.LogQuery{After: after, EventTypes: types, Raw: true})
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		for _, ev := range b.Events {
			fmt.Fprintf(a.out, "%s  %-20s %s v%d  %s\n", ev.RecordedAt.Local().Format("2006-01-02T15:04:05.000"), ev.Type, ev.Stream, ev.Version, ev.Data)
			printed++
			if limit > 0 && printed >= limit {
				return nil
			}
		}
		after = b.Next(after)
		if b.Full {
			continue
		}
		if len(b.Events) > 0 {
			idle = 10 * time.Millisecond
		} else {
			idle = min(idle*2, 500*time.Millisecond)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(idle):
		}
	}
}
