package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/stores/postgres"
)

func (a *App) eventsCmd() *cobra.Command {
	root := group("events", "Work on the event log: prune old ephemeral events, follow new ones, export and import history")
	root.AddCommand(a.pruneCmd(), a.tailCmd(), a.exportCmd(), a.importCmd()) // export, import: events_history.go
	return root
}

func (a *App) pruneCmd() *cobra.Command {
	var olderThan, sagaRetention string
	var opts postgres.PruneOptions
	cmd := &cobra.Command{
		Use:   "prune --older-than DURATION [--stream-type T ...] [--include-aggregates] [--dry-run]",
		Short: "Delete old events of ephemeral stream types that every consumer has passed",
		Long: `prune deletes events of the given stream types (by default those the application
declares ephemeral) recorded before now minus --older-than, by the database clock.

It never deletes an event that a consumer shard which is not disabled has not passed
yet, and never the event of an open dead letter (resolve or discard it, and its event
goes with the next prune: dead-letters retry, dead-letters discard). When a consumer holds
events back, prune says which one and how far behind it is; skip its failing event or
disable it if it should not hold retention back.

A stream type the application does not declare ephemeral is aggregate history:
deleting its old events leaves streams that fold from the middle. Naming one with
--stream-type is refused unless --include-aggregates is given too; run with
--dry-run first to see, per stream type, what would go.

DURATION is a Go duration (90m, 12h) or a number of days (30d), at most ` + fmt.Sprint(maxAgeDays) + `d.

It also deletes saga instances that completed more than --saga-retention ago
(default ` + DefaultSagaRetention + `; 0 keeps them), with their steps, as ` + "`saga prune`" + ` does; active
and failed instances are never deleted.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			d, err := parseAge(olderThan)
			if err != nil {
				return usageError{fmt.Errorf("--older-than: %w", err)}
			}
			opts.OlderThan = d
			sagaAge, err := parseSagaRetention(sagaRetention)
			if err != nil {
				return usageError{fmt.Errorf("--saga-retention: %w", err)}
			}
			if opts.BatchSize < 1 || opts.BatchSize > postgres.MaxPruneBatchSize {
				return usageError{fmt.Errorf("--batch-size %d: want 1 to %d", opts.BatchSize, postgres.MaxPruneBatchSize)}
			}
			return a.withStore(cmd, func(store *postgres.Store) error {
				if err := a.prune(cmd, store, opts); err != nil {
					return err
				}
				return a.pruneSagas(cmd, store, sagaAge, sagaRetention, opts.DryRun) // prune_saga.go
			})
		},
	}
	cmd.Flags().StringVar(&olderThan, "older-than", "", "minimum age of events to delete, e.g. 720h or 30d (required)")
	cmd.Flags().StringSliceVar(&opts.StreamTypes, "stream-type", nil, "stream type to prune (repeatable; default: the ephemeral types)")
	cmd.Flags().BoolVar(&opts.IncludeAggregates, "include-aggregates", false, "allow --stream-type to name types not declared ephemeral (aggregate history)")
	cmd.Flags().BoolVar(&opts.DryRun, "dry-run", false, "count what would be deleted and held back, per stream type; delete nothing")
	cmd.Flags().IntVar(&opts.BatchSize, "batch-size", 10_000, fmt.Sprintf("events deleted per transaction (1 to %d)", postgres.MaxPruneBatchSize))
	cmd.Flags().StringVar(&sagaRetention, "saga-retention", DefaultSagaRetention, "also delete saga instances completed longer ago than this, e.g. 30d or 720h (0: keep them)")
	_ = cmd.MarkFlagRequired("older-than")
	return cmd
}

// prune runs `events prune` on store and reports what it did.
func (a *App) prune(cmd *cobra.Command, store *postgres.Store, opts postgres.PruneOptions) error {
	if len(opts.StreamTypes) == 0 && len(store.Ephemeral()) == 0 {
		return usageError{fmt.Errorf("no stream types: name them with --stream-type (this application declares none ephemeral)")}
	}
	res, err := store.Prune(cmd.Context(), opts)
	if errors.Is(err, postgres.ErrInvalidPrune) {
		return usageError{err}
	}
	if errors.Is(err, postgres.ErrAggregateHistory) {
		return usageError{fmt.Errorf("--stream-type: %w; this deletes their old history: add --include-aggregates if you mean it (try --dry-run first)", err)}
	}
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
		names(types), res.Cutoff.Local().Format(time.RFC3339))
	for _, t := range res.Types {
		kind := "ephemeral"
		if !t.Ephemeral {
			kind = "aggregate history"
		}
		fmt.Fprintf(a.out, "  %d events of stream type %s (%s) from %d %s\n", t.Events, projector.Printable(t.StreamType), kind, t.Streams, plural(t.Streams, "stream"))
	}
	fmt.Fprint(a.out, PruneAdvice(a.cfg.Name, res))
	return nil
}

// plural is word, with an s unless n is one.
func plural(n int64, word string) string {
	if n == 1 {
		return word
	}
	return word + "s"
}

// maxAgeDays is the longest age a time.Duration holds, in whole days
// (about 292 years): a longer one used to wrap around, to a negative age or
// to one of about a second.
const maxAgeDays = int64(math.MaxInt64 / int64(24*time.Hour))

// parseAge accepts Go durations and whole days ("30d"), positive and no
// longer than maxAgeDays.
func parseAge(s string) (time.Duration, error) {
	limit := fmt.Sprintf("at most %dd, about 292 years", maxAgeDays)
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.ParseInt(days, 10, 64)
		switch {
		case errors.Is(err, strconv.ErrRange) || n > maxAgeDays:
			return 0, fmt.Errorf("%q is too long: %s", s, limit)
		case err != nil || n <= 0:
			return 0, fmt.Errorf("%q: want a positive number of days such as 30d, %s", s, limit)
		}
		return time.Duration(n) * 24 * time.Hour, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("%q: want a positive duration such as 720h or 30d, %s", s, limit)
	}
	return d, nil
}

func (a *App) tailCmd() *cobra.Command {
	var f tailFilter
	var limit int
	var fromStart, noFollow bool
	var format string
	cmd := &cobra.Command{
		Use:   "tail [--type T ...] [--stream-type T ... [--stream ID ...]] [--from-start] [--include-archived] [--limit N] [--no-follow] [-o json]",
		Short: "Follow new events live, one line each, until interrupted",
		Long: `tail prints events as they become deliverable, in log order, one line each:
time, type, stream and version, then the JSON payload; with -o json, one JSON
object per line instead. It starts at the log's current horizon (or at the
beginning with --from-start) and follows until interrupted, or until --limit
events were printed. With --no-follow it exits once it has printed what the log
holds now: --from-start --limit 10 --no-follow prints the first ten matching
events, or fewer if fewer match, and exits.

--type keeps events of the given types: types this binary's application defines,
or types it does not define that are in the log (an older event type, another
application's), whose payloads are printed as stored, with a note. --stream-type
keeps events of the given stream types, and --stream (which needs --stream-type)
only the streams with the given ids.

The hot log only, unless --include-archived: then the events of archived streams
(projector streams archive) too, each at its place in log order (useful with
--from-start; new events are never archived).`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if limit < 0 {
				return usageError{fmt.Errorf("--limit %d: want 0 (follow until interrupted) or a positive count", limit)}
			}
			asJSON, err := outputFormat(format)
			if err != nil {
				return err
			}
			if len(f.streams) > 0 && len(f.streamTypes) == 0 {
				return usageError{errors.New("--stream needs --stream-type: a stream id is only unique within its type")}
			}
			for _, v := range f.streamTypes {
				if err := checkName("--stream-type", v); err != nil {
					return err
				}
			}
			for _, v := range f.streams {
				if err := checkName("--stream", v); err != nil {
					return err
				}
			}
			// Types the binary does not define are looked for in the log
			// once connected; an empty registry knows no types at all.
			var undefined []string
			names := a.cfg.Registry.Names()
			for _, t := range f.types {
				if !utf8.ValidString(t) || strings.IndexByte(t, 0) >= 0 || len(t) > projector.MaxNameLength {
					return usageError{fmt.Errorf("--type %s: not an event type name (valid UTF-8 without NUL, at most %d bytes)", projector.Printable(t), projector.MaxNameLength)}
				}
				if _, ok := a.cfg.Registry.Lookup(t); !ok && len(names) > 0 {
					undefined = append(undefined, t)
				}
			}
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
			for _, t := range undefined {
				var stored bool
				if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+store.Table("projector_events")+` WHERE type = $1)
					OR ($2 AND EXISTS (SELECT 1 FROM `+store.Table("projector_events_archive")+` WHERE type = $1))`, t, f.archived).Scan(&stored); err != nil {
					return fmt.Errorf("look for --type %q in the log: %w", t, err)
				}
				if !stored {
					// A typo would otherwise wait forever for events that cannot come.
					return usageError{fmt.Errorf("--type %q is not an event type of this application (defined: %s), and the log holds no event of it", t, strings.Join(names, ", "))}
				}
				fmt.Fprintf(a.errOut, "note: --type %q is not defined by this binary; its events are in the log and are printed as stored\n", t)
			}
			after := projector.Start
			if !fromStart {
				if after, err = store.Horizon(ctx); err != nil {
					return err
				}
			}
			print := a.printLine
			if asJSON {
				enc := json.NewEncoder(a.out)
				print = func(ev projector.Event) error { return enc.Encode(tailJSON(ev)) }
			}
			return a.follow(ctx, store, after, f, limit, !noFollow, print)
		},
	}
	cmd.Flags().StringSliceVar(&f.types, "type", nil, "only events of this type (repeatable)")
	cmd.Flags().StringSliceVar(&f.streamTypes, "stream-type", nil, "only events of streams of this type (repeatable)")
	cmd.Flags().StringSliceVar(&f.streams, "stream", nil, "only events of the stream with this id, with --stream-type (repeatable)")
	cmd.Flags().IntVar(&limit, "limit", 0, "exit after printing this many events (0: follow until interrupted)")
	cmd.Flags().BoolVar(&fromStart, "from-start", false, "print the log from its beginning first")
	cmd.Flags().BoolVar(&f.archived, "include-archived", false, "also print the events of archived streams, in log order")
	cmd.Flags().BoolVar(&noFollow, "no-follow", false, "exit once what the log holds now is printed, instead of following")
	cmd.Flags().StringVarP(&format, "output", "o", "table", "output format: table (one line per event) or json (one object per line)")
	return cmd
}

// tailFilter is what `events tail` keeps.
type tailFilter struct {
	types, streamTypes, streams []string
	// archived also reads the archive (--include-archived).
	archived bool
}

// TailJSON is one line of `events tail -o json`.
type TailJSON struct {
	Position      string            `json:"position"`
	ID            string            `json:"id"`
	RecordedAt    time.Time         `json:"recorded_at"`
	Type          string            `json:"type"`
	SchemaVersion int               `json:"schema_version"`
	Tenant        string            `json:"tenant"`
	StreamType    string            `json:"stream_type"`
	StreamID      string            `json:"stream_id"`
	Version       int64             `json:"version"`
	CorrelationID string            `json:"correlation_id"`
	CausationID   string            `json:"causation_id,omitempty"`
	Actor         string            `json:"actor,omitempty"`
	Headers       map[string]string `json:"headers,omitempty"`
	Data          json.RawMessage   `json:"data"`
}

func tailJSON(ev projector.Event) TailJSON {
	j := TailJSON{
		Position: ev.Position.String(), ID: ev.ID.String(), RecordedAt: ev.RecordedAt, Type: ev.Type, SchemaVersion: ev.SchemaVersion,
		Tenant: ev.Stream.Tenant, StreamType: ev.Stream.Type, StreamID: ev.Stream.ID, Version: ev.Version,
		CorrelationID: ev.Metadata.CorrelationID.String(), Actor: ev.Metadata.Actor, Headers: ev.Metadata.Headers, Data: ev.Data,
	}
	if ev.Metadata.CausationID != uuid.Nil {
		j.CausationID = ev.Metadata.CausationID.String()
	}
	return j
}

// printLine prints one event of the tail: its payload whole (following the
// log is what tail is for), escaped only if it holds a character a
// terminal would obey.
func (a *App) printLine(ev projector.Event) error {
	_, err := fmt.Fprintf(a.out, "%s  %-20s %s v%d  %s\n", ev.RecordedAt.Local().Format("2006-01-02T15:04:05.000Z07:00"),
		projector.Printable(ev.Type), ev.Stream, ev.Version, projector.PrintableText(string(ev.Data), len(ev.Data)))
	return err
}

// follow prints events after the cursor as they arrive, polling while idle;
// unless keepOn, it returns once a read comes back short (the log is read to
// its current horizon).
func (a *App) follow(ctx context.Context, store *postgres.Store, after projector.Position, f tailFilter, limit int, keepOn bool, print func(projector.Event) error) error {
	printed := 0
	idle := 10 * time.Millisecond
	// Without following, "what the log holds now" is every event committed
	// before the start: the gap-safe read reaches them once the transactions
	// still open below them end, so wait for that rather than stop short.
	var head projector.Position
	if !keepOn {
		last := `SELECT tx_id, seq FROM ` + store.Table("projector_events") + ` ORDER BY tx_id DESC, seq DESC LIMIT 1`
		if f.archived {
			last = `SELECT tx_id, seq FROM ((` + last + `) UNION ALL (SELECT tx_id, seq FROM ` + store.Table("projector_events_archive") + `
				ORDER BY tx_id DESC, seq DESC LIMIT 1)) u ORDER BY tx_id DESC, seq DESC LIMIT 1`
		}
		err := store.Pool().QueryRow(ctx, last).Scan(&head.TxID, &head.Seq)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("read the log's head: %w", err)
		}
	}
	for {
		b, err := store.ReadLog(ctx, postgres.LogQuery{After: after, EventTypes: f.types, StreamTypes: f.streamTypes, Raw: true, IncludeArchived: f.archived})
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		for _, ev := range b.Events {
			if len(f.streams) > 0 && !slices.Contains(f.streams, ev.Stream.ID) {
				continue
			}
			if err := print(ev); err != nil {
				return err
			}
			printed++
			if limit > 0 && printed >= limit {
				return nil
			}
		}
		after = b.Next(after)
		if b.Full {
			continue
		}
		if !keepOn && !after.Less(head) {
			return nil
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
