package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/rebuild"
	"github.com/projectorhq/projector/stores/postgres"
)

// ShardJSON is one shard in `status -o json` and `consumer status -o json`.
type ShardJSON struct {
	Consumer    string     `json:"consumer"`
	Instance    string     `json:"instance_id"`
	Status      string     `json:"status"`
	Cursor      string     `json:"cursor"`
	LagEvents   int64      `json:"lag_events"`
	LagSeconds  float64    `json:"lag_seconds"`
	Attempts    int        `json:"attempts"`
	LastError   string     `json:"last_error,omitempty"`
	LastErrorAt *time.Time `json:"last_error_at,omitempty"`
	FailedAt    string     `json:"failed_at,omitempty"`
	NextRetryAt *time.Time `json:"next_retry_at,omitempty"`
	Processed   int64      `json:"processed"`
	UpdatedAt   time.Time  `json:"updated_at"`
	// Dispatcher is live, none or stale: see projection.DispatcherState.
	Dispatcher string     `json:"dispatcher"`
	LastSeenAt *time.Time `json:"last_seen_at,omitempty"`
	// Role is shared, per-instance or rebuild-shadow; Rebuild is the
	// rebuild the shard carries out (`status` only; see status_rebuild.go).
	Role    string            `json:"role"`
	Rebuild *ShardRebuildJSON `json:"rebuild,omitempty"`
	// Partition, Partitions and Owner describe a partition of a
	// partitioned consumer: which one of how many, and the instance that
	// works it ("" for none yet).
	Partition  *int   `json:"partition,omitempty"`
	Partitions int    `json:"partitions,omitempty"`
	Owner      string `json:"owner,omitempty"`
	// InPerSecond, Skew and Hot are a partition's load: events per
	// second appended to its streams over the log's latest events, its
	// share of them over an even share (0: too few to tell), and whether
	// that is projection.HotSkew or more.
	InPerSecond *float64 `json:"in_per_second,omitempty"`
	Skew        *float64 `json:"skew,omitempty"`
	Hot         *bool    `json:"hot,omitempty"`
	// Hold is where a partition waits for its sibling to merge
	// (`consumer merge`), absent when no merge is under way.
	Hold string `json:"hold,omitempty"`
	// Partitioned is, on a partitioned consumer's fence row (role
	// partition-fence, status "partitioned"), its partitions' aggregate;
	// the row's cursor is then the slowest partition's and its lag the
	// partitions' sum (cli/fence.go).
	Partitioned *PartitionsJSON `json:"partitioned,omitempty"`
	// ParkedStreams counts the shard's open parks (`parked list`).
	ParkedStreams int64 `json:"parked_streams"`
}

func toJSON(s projection.ShardState) ShardJSON {
	j := ShardJSON{
		Consumer: s.Consumer, Instance: s.Instance, Status: string(s.Status), Cursor: cursor(s.Cursor),
		LagEvents: s.LagEvents, LagSeconds: s.LagSeconds, Attempts: s.Attempts, LastError: s.LastError,
		Processed: s.Processed, UpdatedAt: s.UpdatedAt, Dispatcher: string(s.Dispatcher), Role: shardRole(s),
		ParkedStreams: s.Parked,
	}
	if !s.LastSeen.IsZero() {
		j.LastSeenAt = &s.LastSeen
	}
	if s.Partitions > 0 {
		p := s.Partition
		in, skew, hot := s.InRate, s.Skew, s.Hot()
		j.Partition, j.Partitions, j.Owner = &p, s.Partitions, s.Owner
		j.InPerSecond, j.Skew, j.Hot = &in, &skew, &hot
		if s.Held {
			j.Hold = cursor(s.Hold)
		}
	}
	if !s.LastErrorAt.IsZero() {
		j.LastErrorAt = &s.LastErrorAt
	}
	if !s.NextRetryAt.IsZero() {
		j.NextRetryAt = &s.NextRetryAt
	}
	if s.FailedAt.TxID != 0 {
		j.FailedAt = cursor(s.FailedAt)
	}
	return j
}

// WriteStatus renders shards as the `status` command does: a table readable
// at a glance, or JSON for scripts. [WriteStatusWithRebuilds] adds the
// rebuilds in progress.
func WriteStatus(w io.Writer, shards []projection.ShardState, asJSON bool) error {
	return WriteStatusWithRebuilds(w, shards, nil, asJSON)
}

// writeTable renders a tab-separated table aligned, without the blanks
// tabwriter leaves at the end of a line whose last cell is empty (the cell
// before it is padded to its column's width).
func writeTable(w io.Writer, fill func(tw io.Writer)) error {
	var buf bytes.Buffer
	tw := tabwriter.NewWriter(&buf, 0, 4, 2, ' ', 0)
	fill(tw)
	if err := tw.Flush(); err != nil {
		return err
	}
	var out strings.Builder
	for line := range strings.Lines(buf.String()) {
		out.WriteString(strings.TrimRight(line, " \n"))
		out.WriteString("\n")
	}
	_, err := io.WriteString(w, out.String())
	return err
}

// dispatcher renders whether a live dispatcher runs the shard, with when
// one was last seen if none does now.
func dispatcher(s projection.ShardState, now time.Time) string {
	d := string(s.Dispatcher)
	if s.Dispatcher != projection.DispatcherLive && !s.LastSeen.IsZero() {
		d += " (seen " + ago(s.LastSeen, now) + ")"
	}
	return d
}

// cursor renders a position for people, the same way in every command and
// in JSON: "tx/seq", and "tx/max" for a cursor moved to the horizon (every
// event of transactions up to tx).
func cursor(p projector.Position) string {
	if p.Seq == math.MaxInt64 {
		return fmt.Sprintf("%d/max", p.TxID)
	}
	return p.String()
}

// age renders a lag in seconds for people, "-" when there is none.
func age(seconds float64) string {
	if seconds <= 0 {
		return "-"
	}
	return human(time.Duration(seconds * float64(time.Second)))
}

// human rounds a duration to what a person reads at a glance: two units at
// most ("10m54s", "2h5m", "3d4h"), milliseconds only below a second.
func human(d time.Duration) string {
	switch {
	case d < 0:
		return "-" + human(-d)
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(time.Second).String()
	case d < time.Hour:
		return twoUnits(d.Round(time.Second), time.Minute, "m", time.Second, "s")
	case d < 24*time.Hour:
		return twoUnits(d.Round(time.Minute), time.Hour, "h", time.Minute, "m")
	}
	return twoUnits(d.Round(time.Hour), 24*time.Hour, "d", time.Hour, "h")
}

// twoUnits renders d in big units and the rest in small ones, leaving out a
// zero rest ("2h", not "2h0m").
func twoUnits(d, big time.Duration, bigName string, small time.Duration, smallName string) string {
	s := fmt.Sprintf("%d%s", d/big, bigName)
	if rest := (d % big) / small; rest > 0 {
		s += fmt.Sprintf("%d%s", rest, smallName)
	}
	return s
}

// ago renders how long before now t was, in its largest unit ("2h ago",
// "in 5s" for a time still to come).
func ago(t, now time.Time) string {
	d := now.Sub(t)
	suffix := " ago"
	prefix := ""
	if d < 0 {
		d, prefix, suffix = -d, "in ", ""
	}
	var v string
	switch {
	case d < time.Second:
		return "just now"
	case d < time.Minute:
		v = fmt.Sprintf("%ds", d/time.Second)
	case d < time.Hour:
		v = fmt.Sprintf("%dm", d/time.Minute)
	case d < 24*time.Hour:
		v = fmt.Sprintf("%dh", d/time.Hour)
	default:
		v = fmt.Sprintf("%dd", d/(24*time.Hour))
	}
	return prefix + v + suffix
}

// timestamp renders a time with its zone and how long ago it was:
// "2026-11-30T09:41:02Z (2h ago)".
func timestamp(t, now time.Time) string {
	return t.Local().Format(time.RFC3339) + " (" + ago(t, now) + ")"
}

func (a *App) statusCmd() *cobra.Command {
	return a.listCmd("status", "Show every consumer shard: status, dispatcher, cursor, lag, attempts, last error")
}

// Bounds of `status --watch`.
const (
	minWatch = 500 * time.Millisecond
	maxWatch = time.Hour
)

// listCmd is `status` and `consumer list`: every shard, as a table or JSON,
// once or every --watch interval until interrupted.
func (a *App) listCmd(use, short string) *cobra.Command {
	var format string
	var watch time.Duration
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		Long: short + `.

DISPATCHER says whether anything is applying the shard's events: live (a running
dispatcher that runs it heartbeat recently), none (no live dispatcher runs it: it
waits, and holds retention back, until one starts or it is removed or disabled), or
stale (a per-instance shard whose instance has not been seen for its expiry, a day
by default: it no longer holds retention back). The instance __rebuild__ is not a
process: it is the shadow shard of a blue/green rebuild, building a new version into
tables no reader uses; rebuilds in progress follow the shards with their percentage
(-o json: each shard's "role" and "rebuild"). --watch 2s redraws every 2 seconds
until interrupted.` + statusJSONHelp(use),
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			asJSON, err := outputFormat(format)
			if err != nil {
				return err
			}
			if cmd.Flags().Changed("watch") && (watch < minWatch || watch > maxWatch) {
				return usageError{fmt.Errorf("--watch %v: want an interval between %v and %v", watch, minWatch, maxWatch)}
			}
			return a.withStore(cmd, func(store *postgres.Store) error {
				ctx, admin := cmd.Context(), projection.NewAdmin(store)
				for {
					shards, err := admin.List(ctx, "")
					var rebuilds []rebuild.Rebuild
					if err == nil {
						rebuilds, err = rebuild.InProgress(ctx, store)
					}
					if err != nil {
						if watch > 0 && ctx.Err() != nil {
							return nil // interrupted mid-refresh
						}
						return err
					}
					if watch > 0 && !asJSON {
						if IsTerminal(a.out) {
							fmt.Fprint(a.out, "\033[H\033[2J") // home, clear
						}
						fmt.Fprintf(a.out, "every %v, %s (Ctrl-C stops)\n\n", watch, time.Now().Format(time.RFC3339))
					}
					switch {
					case use == "status" && asJSON: // an object: the shards and who holds the horizon
						var rep projection.HorizonReport
						if rep, err = projection.Horizon(ctx, store.Pool()); err == nil {
							err = WriteStatusJSON(a.out, shards, rebuilds, rep)
						}
					default:
						err = WriteStatusWithRebuilds(a.out, shards, rebuilds, asJSON)
						if err == nil {
							err = a.writeFailedSagas(ctx, store, asJSON) // status_saga.go
						}
						if err == nil && use == "status" && !asJSON { // who holds the horizon: cli/horizon.go
							err = a.writeStatusHorizon(ctx, store)
						}
						if err == nil && use == "status" && !asJSON { // hot and archived log sizes: streams.go
							err = a.writeLogSizes(ctx, store)
						}
					}
					if err != nil {
						if watch > 0 && ctx.Err() != nil {
							return nil // interrupted mid-refresh
						}
						return err
					}
					if watch == 0 {
						return nil
					}
					select {
					case <-ctx.Done():
						return nil
					case <-time.After(watch):
					}
					if !asJSON && !IsTerminal(a.out) {
						fmt.Fprintln(a.out)
					}
				}
			})
		},
	}
	cmd.Flags().StringVarP(&format, "output", "o", "table", "output format: table or json")
	cmd.Flags().DurationVar(&watch, "watch", 0, fmt.Sprintf("redraw every interval (%v to %v) until interrupted", minWatch, maxWatch))
	return cmd
}

// statusJSONHelp says what -o json prints, which differs between `status`
// (an object with the horizon) and `consumer list` (the array of shards).
func statusJSONHelp(use string) string {
	if use != "status" {
		return "\n\n-o json prints the array of shards."
	}
	return `

-o json prints an object: "shards", the array of shards (what ` + "`consumer list -o json`" + `
prints), and "horizon", its age and the transaction holding it (what ` + "`horizon -o json`" + `
prints). Earlier releases printed the bare array: read .shards, or use consumer list.`
}

// IsTerminal reports whether w is a terminal: where --watch and progress
// bars may redraw in place (carriage returns show as one line only there);
// elsewhere each update is a line of its own.
func IsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// unknownConsumer turns a consumer-not-found error into a usage error
// (exit 2) that lists what exists: the registered consumers, or the shards
// of the named consumer when only the instance is wrong.
func unknownConsumer(ctx context.Context, admin *projection.Admin, consumer string, err error) error {
	if !errors.Is(err, projector.ErrNotFound) {
		return err
	}
	all, lerr := admin.List(ctx, "")
	if lerr != nil {
		return err
	}
	return unknownConsumerIn(all, consumer, err)
}

// unknownConsumerIn is unknownConsumer's usage error for consumer, from
// all, the shards registered.
func unknownConsumerIn(all []projection.ShardState, consumer string, err error) error {
	var consumers, instances []string
	for _, s := range all {
		if !slices.Contains(consumers, s.Consumer) {
			consumers = append(consumers, s.Consumer)
		}
		if s.Consumer == consumer {
			instances = append(instances, s.Instance)
		}
	}
	switch {
	case len(instances) > 0:
		return usageError{fmt.Errorf("%w; consumer %s has shards for instances: %s (choose one with --instance)", err, projector.Printable(consumer), names(instances))}
	case len(consumers) == 0:
		return usageError{fmt.Errorf("%w; no consumers are registered in this schema (they appear when a dispatcher first starts)", err)}
	}
	return usageError{fmt.Errorf("%w; registered consumers: %s", err, names(consumers))}
}

// partitionUnattended is the advice for a partition no live dispatcher
// runs (name, consumer, its --partition args): any dispatcher of the
// consumer takes it, and a partition is never removed alone (its streams
// would be cut out of the consumer), only with the whole consumer.
const partitionUnattended = "No live dispatcher runs it: start one with this projection (`%[1]s run`; any process running it takes the partitions), or if the projection is retired, `%[1]s consumer remove %[2]s` (every partition; or `%[1]s consumer disable %[3]s` to pass over this partition, keeping its state).\n"

// PruneAdvice is what `events prune` prints when a consumer shard held
// events back: which, how far behind, and the fix that matches its state
// and whether a live dispatcher runs it. Empty when nothing was held back.
func PruneAdvice(name string, res postgres.PruneResult) string {
	b := res.Blocker
	if b == nil {
		return ""
	}
	id, partition := shardArgs(b.Consumer, b.Instance)
	var sb strings.Builder
	fmt.Fprintf(&sb, "held back %d events: consumer %s (instance %s, %s, dispatcher %s) has not passed them; it is %d events behind at %s.\n",
		res.HeldBack, projector.Printable(b.Consumer), projector.Printable(b.Instance), projector.Printable(b.Status),
		projector.Printable(b.Dispatcher), b.Behind, cursor(b.Cursor))
	switch {
	case b.Status == string(projection.StatusDead):
		fmt.Fprintf(&sb, "It is dead: see why with `%s consumer status %s`, then fix the handler and `%s consumer restart %s`, or `%s consumer skip %s` past the failing event.\n",
			name, id, name, id, name, id)
	case b.Dispatcher == string(projection.DispatcherLive):
		fmt.Fprintf(&sb, "A live dispatcher is applying it: it passes them as it catches up (`%s status --watch 5s` shows its lag); prune again later.\n", name)
	case partition:
		fmt.Fprintf(&sb, partitionUnattended, name, projector.Printable(b.Consumer), id)
	default:
		fmt.Fprintf(&sb, "No live dispatcher runs it: start one with this projection (`%s run`), or if the projection is retired, `%s consumer remove %s` (or `%s consumer disable %s` to keep its state).\n",
			name, name, id, name, id)
	}
	return sb.String()
}

func outputFormat(f string) (bool, error) {
	switch f {
	case "table", "":
		return false, nil
	case "json":
		return true, nil
	}
	return false, usageError{fmt.Errorf("--output %q: want table or json", f)}
}

// withAdmin opens the pool and store for an ops command, runs fn and
// releases them.
func (a *App) withAdmin(cmd *cobra.Command, fn func(*projection.Admin) error) error {
	return a.withStore(cmd, func(store *postgres.Store) error { return fn(projection.NewAdmin(store)) })
}

// writeList writes a listing: as a JSON array (empty, never null), or as a
// table filled by table, or the line none when there is nothing.
func writeList[T any](w io.Writer, asJSON bool, items []T, none string, table func(tw io.Writer)) error {
	if asJSON {
		if items == nil {
			items = []T{}
		}
		return writeJSON(w, items)
	}
	if len(items) == 0 {
		_, err := fmt.Fprintln(w, none)
		return err
	}
	return writeTable(w, table)
}

// writeJSON writes v as indented JSON, the form every `-o json` takes.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func (a *App) consumerCmd() *cobra.Command {
	var instance, format, partition string
	root := group("consumer", "Inspect and steer consumer shards (list, status, restart, skip, disable, enable, split, merge, remove)")
	root.Long = `Each async projection is a consumer with one shard (shared delivery) or one per
instance (per-instance delivery). These commands act on one shard: the shared one
unless --instance names another. A transition the shard's state does not allow is
refused with exit code 3 and changes nothing:

  restart   dead → idle, retrying the failing event
  skip      dead, or processing while an event is failing → idle, past the failing
            event, which is recorded in projector_dead_letters
  disable   idle, processing or dead → disabled (retention stops waiting for it)
  enable    disabled → idle
  split     a partition (or every one) into two, each at its cursor, live
  merge     two sibling partitions (or every pair) into one, live, once their
            cursors meet
  remove    unregister: delete the consumer's shards (all of them, or the one
            --instance names), keeping its dead letters; refused (exit code 3)
            while a dispatcher runs it

A consumer name that is not registered is a usage error (exit code 2) that lists
the registered ones.`
	root.PersistentFlags().StringVar(&instance, "instance", projection.SharedInstance, "instance id of the shard (per-instance consumers)")
	root.PersistentFlags().StringVar(&partition, "partition", "", "partition of a partitioned consumer: P/N (P of N), or P when its partitions are all one of N")
	// shardOf resolves NAME with --instance or --partition to a shard id;
	// partitioned reports a partitioned consumer named without --partition.
	shardOf := func(cmd *cobra.Command, admin *projection.Admin, name string) (id projection.ShardID, partitioned []projection.ShardState, err error) {
		id = projection.ShardID{Consumer: name, Instance: instance}
		set := cmd.Flags().Changed("partition")
		if set && cmd.Flags().Changed("instance") {
			return id, nil, usageError{errors.New("--partition and --instance name a shard each: give one")}
		}
		if cmd.Flags().Changed("instance") {
			if instance == "" {
				// Empty would name the shared shard silently (the library's
				// normal form): an operator who typed --instance meant one.
				return id, nil, usageError{fmt.Errorf("--instance is empty: name a per-instance shard's id, or leave the flag out for the shared shard (%s)", projection.SharedInstance)}
			}
			return id, nil, checkName("--instance", instance)
		}
		shards, err := admin.List(cmd.Context(), name)
		if err != nil {
			return id, nil, err
		}
		var parts []projection.ShardState
		for _, s := range shards {
			if s.Partitions > 0 {
				parts = append(parts, s)
			}
		}
		if set {
			seg, err := partitionFlag(name, partition, parts)
			if err != nil {
				return id, nil, err
			}
			id.Instance = projection.PartitionInstance(int(seg.Value), seg.Count())
			return id, nil, nil
		}
		return id, parts, nil
	}

	list := a.listCmd("list", "List every consumer shard (same as status)")

	status := &cobra.Command{
		Use:   "status NAME",
		Short: "Show one shard in full",
		Args:  exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			asJSON, err := outputFormat(format)
			if err != nil {
				return err
			}
			return a.withAdmin(cmd, func(admin *projection.Admin) error {
				id, parts, err := shardOf(cmd, admin, args[0])
				if err != nil {
					return err
				}
				st, err := admin.Status(cmd.Context(), id)
				if err != nil {
					return unknownConsumer(cmd.Context(), admin, args[0], err)
				}
				var fence *fenceSummary
				if st.Fence() {
					// The consumer as its partitions make it (cli/fence.go).
					f := summarizeFence(st, parts)
					fence = &f
				}
				if asJSON {
					if fence != nil {
						return writeJSON(a.out, fence.json())
					}
					return writeJSON(a.out, toJSON(st))
				}
				return writeShard(a.out, st, fence)
			})
		},
	}
	status.Flags().StringVarP(&format, "output", "o", "table", "output format: table or json")
	root.AddCommand(list, status)

	ops := []struct {
		use, short string
		run        func(*projection.Admin, context.Context, projection.ShardID) error
	}{
		{"restart", "Retry the failing event of a dead shard", (*projection.Admin).Restart},
		{"skip", "Move a dead or failing shard past its failing event (recorded as a dead letter)", (*projection.Admin).Skip},
		{"disable", "Stop a shard; retention no longer waits for it", (*projection.Admin).Disable},
		{"enable", "Resume a disabled shard from its cursor", (*projection.Admin).Enable},
	}
	for _, op := range ops {
		root.AddCommand(&cobra.Command{
			Use:   op.use + " NAME",
			Short: op.short,
			Args:  exactArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				return a.withAdmin(cmd, func(admin *projection.Admin) error {
					id, parts, err := shardOf(cmd, admin, args[0])
					if err != nil {
						return err
					}
					if len(parts) > 0 && op.use == "restart" {
						return a.restartDeadPartitions(cmd.Context(), admin, args[0], parts)
					}
					if err := op.run(admin, cmd.Context(), id); err != nil {
						return unknownConsumer(cmd.Context(), admin, id.Consumer, err)
					}
					st, err := admin.Status(cmd.Context(), id)
					if err != nil {
						return err
					}
					fmt.Fprintf(a.out, "%s %s: now %s at %s\n", op.use, projector.Printable(id.String()), st.Status, cursor(st.Cursor))
					return nil
				})
			},
		})
	}

	root.AddCommand(a.splitCmd(&partition), a.mergeCmd(&partition))

	var by string
	remove := &cobra.Command{
		Use:   "remove NAME",
		Short: "Unregister a consumer no dispatcher runs: delete its shards (every one, or --instance's), discard its open parks, keep its dead letters",
		Long: `Unregister a consumer no dispatcher runs: delete its shards (every one, or the one
--instance names). Its open parks on those shards are discarded in the same transaction,
recorded as discarded by --by "(consumer removed)", and their pending retry requests
cancelled: a dispatcher that runs the projection again registers it afresh from its
StartFrom and applies those events itself. Its dead letters are kept.`,
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			only := ""
			if cmd.Flags().Changed("instance") {
				only = instance
			}
			who, err := operatorName(by, a.getenv)
			if err != nil {
				return err
			}
			if len(who)+len(projection.RemovedBy) > projector.MaxNameLength {
				return usageError{fmt.Errorf("--by %s: at most %d bytes here (the parks it closes record it followed by %q)",
					projector.Printable(who), projector.MaxNameLength-len(projection.RemovedBy), projection.RemovedBy)}
			}
			return a.withAdmin(cmd, func(admin *projection.Admin) error {
				r, err := admin.RemoveAs(cmd.Context(), args[0], only, who)
				if err != nil {
					return unknownConsumer(cmd.Context(), admin, args[0], err)
				}
				shards := make([]string, len(r.Shards))
				for i, id := range r.Shards {
					shards[i] = id.String()
				}
				parks := "no open parks"
				if r.ParksClosed > 0 {
					parks = fmt.Sprintf("discarded its %d open %s (parked list --consumer %s --status discarded)",
						r.ParksClosed, plural(int64(r.ParksClosed), "park"), projector.Printable(args[0]))
					if r.RetriesCancelled > 0 {
						parks += fmt.Sprintf(", cancelling %d pending retry %s", r.RetriesCancelled, plural(int64(r.RetriesCancelled), "request"))
					}
				}
				fmt.Fprintf(a.out, "removed consumer %s: %d shards (%s); %s; its dead letters are kept\n",
					projector.Printable(args[0]), len(r.Shards), names(shards), parks)
				return nil
			})
		},
	}
	remove.Flags().StringVar(&by, "by", "", "who is removing it, recorded on the parks it discards (default $USER@host; without $USER the OS user, else the uid)")
	root.AddCommand(remove)
	return root
}

// writeShard renders one shard for `consumer status`; fence, when the
// shard is a partitioned consumer's fence row, is what it stands for.
func writeShard(w io.Writer, s projection.ShardState, fence *fenceSummary) error {
	now := time.Now()
	status := string(s.Status)
	if fence != nil {
		s, status = fence.shard, fence.statusCell()
	}
	return writeTable(w, func(tw io.Writer) {
		row := func(k, v string) { fmt.Fprintf(tw, "%s\t%s\n", k, v) }
		row("consumer", projector.Printable(s.Consumer))
		row("instance", projector.Printable(s.Instance))
		if s.Instance == projection.RebuildInstance {
			row("role", "shadow shard of a blue/green rebuild: builds the new version into tables no reader uses (`rebuild list`)")
		}
		if s.Partitions > 0 {
			row("partition", fmt.Sprintf("%d of %d", s.Partition, s.Partitions))
			row("owner", cmpOr(projector.Printable(s.Owner), "none yet"))
			row("load", loadCell(s)+fmt.Sprintf(" (events appended to its streams, over the log's last %d; skew: its share over an even share, HOT from %.0f)", projection.LoadWindow, projection.HotSkew))
			if s.Held {
				row("held", "at "+cursor(s.Hold)+" for a merge with its sibling: `consumer merge` finishes it")
			}
		}
		if s.Fence() {
			row("role", "a partitioned consumer: its row here only fences binaries that do not know partitions (stored as disabled); "+
				"the rows below are its partitions' aggregate: cursor the slowest partition's, lag their sum (each one: --partition P/N)")
		}
		row("status", status)
		row("dispatcher", dispatcher(s, now))
		if !s.LastSeen.IsZero() {
			row("last seen", timestamp(s.LastSeen, now))
		}
		row("cursor", cursor(s.Cursor))
		row("lag", fmt.Sprintf("%d events, oldest %s", s.LagEvents, age(s.LagSeconds)))
		row("processed", fmt.Sprint(s.Processed))
		if s.Parked > 0 {
			row("parked streams", fmt.Sprintf("%d, held back until retried or discarded (parked list --consumer %s)", s.Parked, projector.Printable(s.Consumer)))
		}
		row("attempts", fmt.Sprint(s.Attempts))
		if s.LastError != "" {
			row("last error", text(s.LastError, lineText))
			row("last error at", timestamp(s.LastErrorAt, now))
		}
		if s.FailedAt.TxID != 0 {
			row("failing event", fmt.Sprintf("%s at %s", s.FailedEventID, cursor(s.FailedAt)))
		}
		if !s.NextRetryAt.IsZero() {
			row("next retry", timestamp(s.NextRetryAt, now))
		}
		row("updated", timestamp(s.UpdatedAt, now))
	})
}

// exactArgs is cobra.ExactArgs with the usage exit code, naming the
// missing argument from the command's Use line ("skip NAME": "missing
// NAME").
func exactArgs(n int) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) < n {
			names := strings.Fields(cmd.Use)[1:]
			missing := fmt.Sprintf("%d more argument(s)", n-len(args))
			if len(names) >= n {
				missing = strings.Join(names[len(args):n], " ")
			}
			return usageError{fmt.Errorf("missing %s (usage: %s)", missing, cmd.UseLine())}
		}
		if err := cobra.ExactArgs(n)(cmd, args); err != nil {
			return usageError{fmt.Errorf("%w (usage: %s)", err, cmd.UseLine())}
		}
		return nil
	}
}

// restarter is what restartDeadPartitions asks of [projection.Admin].
type restarter interface {
	Restart(context.Context, projection.ShardID) error
	List(context.Context, string) ([]projection.ShardState, error)
}

// restartDeadPartitions is `consumer restart NAME` on a partitioned
// consumer without --partition: it restarts the dead partitions only, and
// is refused (exit code 3) when none is dead.
//
// parts is the layout as listed before it acts: a dead partition split
// since (a `consumer split`, which takes dead partitions too) is gone, its
// failure carried by the child whose streams hold the failing event (both
// children when that event was archived), the other starting clean. Its
// restart found no row and failed the whole command ("not found"); now the
// layout is read again and the dead partitions that lie inside the one gone
// are restarted in its place, each named as it is. A merge takes no dead
// partition, so a dead one gone was split (or removed, leaving nothing).
func (a *App) restartDeadPartitions(ctx context.Context, admin restarter, name string, parts []projection.ShardState) error {
	restarted := 0
	var todo []projection.ShardState
	for _, s := range parts {
		if s.Status == projection.StatusDead {
			todo = append(todo, s)
		}
	}
	tried := map[string]bool{}
	for len(todo) > 0 {
		s := todo[0]
		todo = todo[1:]
		if tried[s.Instance] {
			continue
		}
		tried[s.Instance] = true
		err := admin.Restart(ctx, s.ShardID)
		switch {
		case errors.Is(err, projector.ErrInvalidTransition):
			continue // restarted by someone else meanwhile
		case errors.Is(err, projector.ErrNotFound):
			inside, err := deadInside(ctx, admin, name, s)
			if err != nil {
				return err
			}
			todo = append(todo, inside...)
			continue
		case err != nil:
			return err
		}
		restarted++
		fmt.Fprintf(a.out, "restart %s partition %d/%d: now idle at %s\n", projector.Printable(name), s.Partition, s.Partitions, cursor(s.Cursor))
	}
	if restarted == 0 {
		return &projection.TransitionError{Shard: projection.ShardID{Consumer: name}, Op: "restart", From: projection.StatusIdle,
			Allowed: []projection.Status{projection.StatusDead}, Detail: "no partition is dead (name one with --partition P)"}
	}
	return nil
}

// deadInside lists consumer name's partitions again and returns the dead
// ones inside gone, a partition listed before whose row is gone: its
// children (or theirs) once it was split.
func deadInside(ctx context.Context, admin restarter, name string, gone projection.ShardState) ([]projection.ShardState, error) {
	outer, err := postgres.SegmentOf(gone.Partition, gone.Partitions)
	if err != nil {
		return nil, err
	}
	shards, err := admin.List(ctx, name)
	if err != nil {
		return nil, err
	}
	var out []projection.ShardState
	for _, s := range shards {
		if s.Partitions == 0 || s.Status != projection.StatusDead {
			continue
		}
		if seg, err := postgres.SegmentOf(s.Partition, s.Partitions); err == nil && outer.Covers(seg) {
			out = append(out, s)
		}
	}
	return out, nil
}
