package cli

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

func (a *App) streamsCmd() *cobra.Command {
	root := group("streams", "Work on whole streams: archive closed ones out of the hot log, bring them back")
	root.AddCommand(a.archiveCmd(false), a.archiveCmd(true))
	return root
}

// archiveFlags are the selectors `streams archive` and `streams unarchive`
// share.
type archiveFlags struct {
	streams         []string
	streamType, age string
	tenant          string
	dryRun          bool
	batch           int
}

// options turns the flags into the store's options, range-checked.
func (f archiveFlags) options(unarchive bool) (postgres.ArchiveOptions, error) {
	opts := postgres.ArchiveOptions{DryRun: f.dryRun, BatchSize: f.batch}
	if f.batch < 1 || f.batch > postgres.MaxArchiveBatchSize {
		return opts, fmt.Errorf("--batch-size %d: want 1 to %d", f.batch, postgres.MaxArchiveBatchSize)
	}
	switch {
	case len(f.streams) > 0 && f.streamType != "":
		return opts, errors.New("name streams with --stream, or a stream type with --stream-type, not both")
	case len(f.streams) == 0 && f.streamType == "":
		return opts, errors.New("name streams with --stream TYPE/ID, or a stream type with --stream-type")
	case len(f.streams) > 0 && f.age != "":
		return opts, errors.New("--older-than goes with --stream-type; named streams are archived whatever their age")
	case unarchive && f.age != "":
		return opts, errors.New("--older-than: unarchive restores every archived stream it selects, whatever its age")
	}
	for _, s := range f.streams {
		typ, id, ok := strings.Cut(s, "/")
		if !ok || typ == "" || id == "" {
			return opts, fmt.Errorf("--stream %s: want TYPE/ID", projector.Printable(s))
		}
		opts.Streams = append(opts.Streams, projector.StreamRef{Tenant: cmp.Or(f.tenant, projector.SystemTenant), Type: typ, ID: id})
	}
	if f.streamType != "" {
		opts.StreamType, opts.Tenant = f.streamType, f.tenant
		if !unarchive {
			if f.age == "" {
				return opts, errors.New("--stream-type needs --older-than: the age of a stream's last event")
			}
			d, err := parseAge(f.age)
			if err != nil {
				return opts, fmt.Errorf("--older-than: %w", err)
			}
			opts.OlderThan = d
		}
	}
	return opts, nil
}

func (a *App) archiveCmd(unarchive bool) *cobra.Command {
	f := archiveFlags{}
	use, short, long := "archive", "Move closed streams' events out of the hot log into the archive",
		`archive moves whole streams' events from projector_events into projector_events_archive,
so the hot table and its indexes hold only live streams. Name streams with --stream TYPE/ID
(repeatable; --tenant gives their tenant), or select a stream type with --stream-type and
--older-than DURATION (the age of each stream's last append, by the database clock),
optionally of one --tenant.

A stream moves only when every consumer shard that is not disabled has passed all its events
and none of them has an open dead letter; others are counted as held back (promise 9; a stale
per-instance shard holds archiving back too: remove it with consumer remove). A stream being
appended to at that moment is skipped. Appending to an archived stream fails (ErrStreamArchived),
reading it needs IncludeArchived, and rebuilds replay it from the archive (docs/rebuilds.md).
--dry-run counts what would move.

DURATION is a Go duration (90m, 12h) or a number of days (30d).`
	if unarchive {
		use, short, long = "unarchive", "Move archived streams' events back into the hot log",
			`unarchive moves archived streams' events back into projector_events, at the log positions
they had, and makes the streams writable again. Name streams with --stream TYPE/ID (repeatable;
--tenant gives their tenant), or every archived stream of --stream-type (optionally of one
--tenant). Consumers do not apply the events again: they had passed them before they were
archived. --dry-run counts what would move.`
	}
	// The usage line says what the command accepts: archive by type needs
	// --older-than, and unarchive has no such flag (restoring a type
	// restores every archived stream of it).
	selector := "(--stream TYPE/ID ... | --stream-type T --older-than DURATION)"
	if unarchive {
		selector = "(--stream TYPE/ID ... | --stream-type T)"
	}
	cmd := &cobra.Command{
		Use:   use + " " + selector + " [--tenant T] [--dry-run] [--batch-size N]",
		Short: short,
		Long:  long,
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			opts, err := f.options(unarchive)
			if err != nil {
				return usageError{err}
			}
			return a.withStore(cmd, func(store *postgres.Store) error {
				run, verb := store.Archive, "archived"
				if unarchive {
					run, verb = store.Unarchive, "unarchived"
				}
				res, err := run(cmd.Context(), opts)
				if errors.Is(err, postgres.ErrInvalidArchive) {
					return usageError{err}
				}
				if err != nil {
					return err
				}
				if opts.DryRun {
					verb = "would move"
				}
				fmt.Fprintf(a.out, "%s %d %s (%d %s)", verb, res.Streams, plural(res.Streams, "stream"), res.Events, plural(res.Events, "event"))
				if !res.Cutoff.IsZero() {
					fmt.Fprintf(a.out, " last appended to before %s", res.Cutoff.Local().Format(time.RFC3339))
				}
				fmt.Fprintln(a.out)
				if res.HeldBack > 0 {
					fmt.Fprintf(a.out, "held back %d %s: a consumer shard has not passed all their events, or one has an open dead letter or park\n",
						res.HeldBack, plural(res.HeldBack, "stream"))
					shards, err := projection.NewAdmin(store).List(cmd.Context(), "")
					if err != nil {
						return err
					}
					var deadLetters, parks int64
					if err := store.Pool().QueryRow(cmd.Context(), `SELECT
						(SELECT count(*) FROM `+store.Table("projector_dead_letters")+` WHERE status = 'open'),
						(SELECT count(*) FROM `+store.Table("projector_parks")+` WHERE status = 'parked')`).Scan(&deadLetters, &parks); err != nil {
						return fmt.Errorf("held back streams; counting open dead letters and parks: %w", err)
					}
					fmt.Fprint(a.out, archiveAdvice(a.cfg.Name, shards, deadLetters, parks))
				}
				if res.Skipped > 0 {
					why, err := skippedWhy(cmd.Context(), store, opts, unarchive)
					if err != nil {
						return err
					}
					fmt.Fprintf(a.out, "skipped %d %s: %s\n", res.Skipped, plural(res.Skipped, "stream"), why)
				}
				return nil
			})
		},
	}
	cmd.Flags().StringSliceVar(&f.streams, "stream", nil, "a stream to move, as TYPE/ID (repeatable)")
	cmd.Flags().StringVar(&f.streamType, "stream-type", "", "move the streams of this type")
	if !unarchive {
		cmd.Flags().StringVar(&f.age, "older-than", "", "with --stream-type: minimum age of a stream's last event, e.g. 720h or 30d")
	}
	cmd.Flags().StringVar(&f.tenant, "tenant", "", "the tenant of the streams (default: "+projector.SystemTenant+" for --stream, every tenant for --stream-type)")
	cmd.Flags().BoolVar(&f.dryRun, "dry-run", false, "count what would move; move nothing")
	cmd.Flags().IntVar(&f.batch, "batch-size", 100, fmt.Sprintf("streams moved per transaction (1 to %d)", postgres.MaxArchiveBatchSize))
	return cmd
}

// skippedWhy says why `streams archive` or `unarchive` skipped streams.
// For one named stream it reads the stream's head after the fact and names
// the reason that fits what it finds (at the time of the report: the store
// does not say which stream it skipped why); otherwise it lists the
// reasons the selection can have. It said "already archived, no such
// stream, being appended to, or appended to since chosen" for anything,
// the last cause impossible for a named stream and the operator left to
// find which.
func skippedWhy(ctx context.Context, store *postgres.Store, opts postgres.ArchiveOptions, unarchive bool) (string, error) {
	named := map[projector.StreamRef]bool{}
	for _, st := range opts.Streams {
		named[st] = true
	}
	if len(named) != 1 {
		switch {
		case len(named) > 1 && unarchive:
			return "not archived, no such stream, or being moved by another archive or unarchive at that moment", nil
		case len(named) > 1 && opts.DryRun:
			return "already archived, or no such stream", nil
		case len(named) > 1:
			return "already archived, no such stream, or being appended to (or moved by another archive) at that moment", nil
		case unarchive:
			return "being moved by another archive or unarchive at that moment, or unarchived since they were chosen", nil
		case opts.DryRun:
			return "archived by another archive since they were chosen", nil
		}
		return "being appended to (or moved by another archive) at that moment, appended to since they were chosen, or archived meanwhile", nil
	}
	st := opts.Streams[0]
	var archived bool
	err := store.Pool().QueryRow(ctx, `SELECT archived_at IS NOT NULL FROM `+store.Table("projector_streams")+`
		WHERE tenant_id = $1 AND stream_type = $2 AND stream_id = $3`, st.Tenant, st.Type, st.ID).Scan(&archived)
	exists := err == nil
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return "", fmt.Errorf("skipped %s; reading why: %w", projector.Printable(st.String()), err)
	}
	const now = " (so at the time of this report)"
	switch {
	case !exists:
		// Streams are per tenant, and --tenant defaults to the system
		// tenant: the likeliest slip is a tenant's stream named without it.
		return fmt.Sprintf("no such stream in tenant %s%s; a stream is its tenant's (--tenant)", projector.Printable(st.Tenant), now), nil
	case unarchive && !archived:
		return "not archived" + now, nil
	case unarchive:
		return "being moved by another archive or unarchive at that moment (it is archived at the time of this report: unarchive it again)", nil
	case archived:
		return "already archived" + now, nil
	case opts.DryRun:
		return "not a hot stream when counted, and a hot one at the time of this report (unarchived or created since): count again", nil
	}
	return "being appended to (or moved by another archive) at that moment; it is in the hot log at the time of this report: archive it again", nil
}

// writeLogSizes is status's line on the log: the estimated events in the
// hot table and in the archive (`streams archive`), from the planner's
// statistics, so it costs nothing on a large log.
func (a *App) writeLogSizes(ctx context.Context, store *postgres.Store) error {
	hot, archived, err := store.ArchiveSizes(ctx)
	if err != nil {
		return err
	}
	estimate := func(n int64) string {
		if n < 0 {
			return "unknown (not analyzed yet)"
		}
		return fmt.Sprintf("about %d", n)
	}
	fmt.Fprintf(a.out, "\nlog: %s events hot, %s archived (estimates from table statistics)\n", estimate(hot), estimate(archived))
	var tables []string
	for _, t := range []struct {
		n    int64
		name string
	}{{hot, "projector_events"}, {archived, "projector_events_archive"}} {
		if t.n < 0 {
			tables = append(tables, "ANALYZE "+projector.Printable(store.Table(t.name)))
		}
	}
	if len(tables) > 0 {
		fmt.Fprintf(a.out, "  %s gives the estimate now (autovacuum does once enough rows changed)\n", strings.Join(tables, "; "))
	}
	return nil
}

// logSizeCollector exports the estimated hot and archived log sizes
// (postgres.Store.ArchiveSizes) as projector_log_events_estimate{table},
// read at each scrape: one catalogue lookup, whatever the log's size.
type logSizeCollector struct {
	store *postgres.Store
	desc  *prometheus.Desc
}

func newLogSizeCollector(store *postgres.Store) *logSizeCollector {
	return &logSizeCollector{store: store, desc: prometheus.NewDesc("projector_log_events_estimate",
		"Estimated events in the hot log (table=hot) and in the archive (table=archive), from table statistics; -1 before the first ANALYZE.",
		[]string{"table"}, nil)}
}

func (c *logSizeCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *logSizeCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	hot, archived, err := c.store.ArchiveSizes(ctx)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.desc, err)
		return
	}
	ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(hot), "hot")
	ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(archived), "archive")
}

// archiveAdvice is what `streams archive` prints after holding streams back:
// the slowest shard that is not disabled, which the guard compares every
// stream with (a stale per-instance shard included, unlike prune's), what to
// do about it, and, when there are open dead letters or parks (any
// consumer's: the guard holds a stream back for any), how many and where
// they show. The dead-letter/park line used to close every advice, also
// with none open, sending the operator to look for what was not there.
func archiveAdvice(name string, shards []projection.ShardState, deadLetters, parks int64) string {
	var slowest *projection.ShardState
	for i, s := range shards {
		if s.Status == projection.StatusDisabled || s.Fence() {
			continue
		}
		if slowest == nil || s.Cursor.Less(slowest.Cursor) {
			slowest = &shards[i]
		}
	}
	// The slowest shard is advice only when it is behind (or dead, stuck on
	// a failing event, which may be archived and so not counted in its
	// lag): with every shard caught up, what held the streams back is a
	// dead letter or a park, and "0 events behind ... archive again once it
	// has caught up" sent the operator to wait for nothing. Or when no live
	// dispatcher runs it: its lag counts only its own events (its types,
	// a partition's streams), of which there may be none, while the guard
	// stops at its cursor, which nothing moves; "cleared since; archive
	// again" then sent the operator round in a loop.
	unattended := slowest != nil && slowest.Dispatcher != projection.DispatcherLive
	behind := slowest != nil && (slowest.LagEvents > 0 || slowest.Status == projection.StatusDead || unattended)
	var sb strings.Builder
	if behind {
		b := slowest
		id, partition := shardArgs(b.Consumer, b.Instance)
		lag := fmt.Sprintf("%d events behind", b.LagEvents)
		if b.LagEvents == 0 {
			lag = "none of its own events behind, but the guard stops at its cursor"
		}
		fmt.Fprintf(&sb, "slowest shard: consumer %s (instance %s, %s, dispatcher %s) at %s, %s.\n",
			projector.Printable(b.Consumer), projector.Printable(b.Instance), projector.Printable(string(b.Status)),
			projector.Printable(string(b.Dispatcher)), cursor(b.Cursor), lag)
		switch {
		case b.Status == projection.StatusDead:
			fmt.Fprintf(&sb, "It is dead: see why with `%s consumer status %s`, then `%s consumer restart %s` or `%s consumer skip %s`.\n",
				name, id, name, id, name, id)
		case b.Dispatcher == projection.DispatcherLive:
			fmt.Fprintf(&sb, "A live dispatcher is applying it: archive again once it has caught up (`%s status`).\n", name)
		case partition:
			fmt.Fprintf(&sb, partitionUnattended, name, projector.Printable(b.Consumer), id)
		default:
			fmt.Fprintf(&sb, "No live dispatcher runs it: start one, or if its process is gone for good (a stopped `run`'s per-instance shard), `%s consumer remove %s` (or `%s consumer disable %s`).\n",
				name, id, name, id)
		}
	}
	var holds []string
	if deadLetters > 0 {
		holds = append(holds, fmt.Sprintf("%d dead %s (`%s dead-letters list`)", deadLetters, plural(deadLetters, "letter"), name))
	}
	if parks > 0 {
		holds = append(holds, fmt.Sprintf("%d %s (`%s parked list`)", parks, plural(parks, "park"), name))
	}
	switch {
	case len(holds) > 0:
		fmt.Fprintf(&sb, "Streams every shard has passed are held by an open dead letter or park of theirs; open now: %s.\n", strings.Join(holds, " and "))
	case !behind:
		fmt.Fprintf(&sb, "No shard is behind and no dead letter or park is open now: what held them back has cleared since; archive again.\n")
	}
	return sb.String()
}
