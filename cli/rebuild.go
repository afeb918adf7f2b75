package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/rebuild"
	"github.com/projectorhq/projector/stores/postgres"
)

func (a *App) rebuildCmd() *cobra.Command {
	var inPlace, hold, wait, diff, here bool
	var version, limit int
	var pickup time.Duration
	var partial *partialFlags // --tenant, --stream-type/--stream-id: rebuild_partial.go
	cmd := &cobra.Command{
		Use:   "rebuild NAME | rebuild {list|diff|cancel|switch|drop-old} ...",
		Short: "Rebuild a projection from the log: blue/green (default) or in place",
		Long: `rebuild NAME records a rebuild of the projection NAME; the dispatchers that run
the projection carry it out (this binary needs only the database).

Blue/green (the default) builds the projection's version (--version, default the
highest a dispatcher has registered) into shadow tables while the live model keeps
serving, and switches atomically once it has caught up; --hold waits for
'rebuild switch NAME' instead, so the shadow tables can be compared first.
--diff does that and follows the rebuild until it is ready, then prints what the
switch would change (see 'rebuild diff').
--in-place clears the live tables and replays into them: readers see an empty,
then partial model until it catches up (for development and small models).

--wait follows the rebuild to its end with a progress bar (plain lines when not a
terminal), then says how many streams are parked, if any (ParkStream; still exit 0).
--here, in a binary that has the projection compiled in, runs the
rebuild in this process (a dispatcher with only that projection) until it has
switched or is done, then stops; run again, it resumes the rebuild.

--here --tenant X, or --here --stream-type T --stream-id ID, rebuilds only what
that tenant or stream contributed, at once, in this process (a partial rebuild).
See docs/rebuilds.md.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usageError{fmt.Errorf("rebuild needs the projection's NAME (or a subcommand: list, diff, cancel, switch, drop-old)")}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if partial.set(cmd) {
				return a.runPartial(cmd, args[0], partial)
			}
			if version < 0 || version > rebuild.MaxVersion {
				return usageError{fmt.Errorf("--version %d: want a version from 1 to %d (0: the highest registered)", version, rebuild.MaxVersion)}
			}
			if pickup < 0 || pickup > 24*time.Hour {
				return usageError{fmt.Errorf("--pickup-timeout %v: want 0 (no limit) up to 24h", pickup)}
			}
			if err := checkDiffLimit(limit); err != nil {
				return err
			}
			if diff && inPlace {
				return usageError{errors.New("--diff compares shadow tables with the live ones; an in-place rebuild has none")}
			}
			opts := rebuild.Options{Version: version, Hold: hold || diff, Mode: rebuild.BlueGreen}
			if inPlace {
				opts.Mode = rebuild.InPlace
			}
			if here {
				return a.rebuildHere(cmd, args[0], opts, diff, limit)
			}
			return a.withStore(cmd, func(store *postgres.Store) error {
				rb, err := rebuild.Request(cmd.Context(), store, args[0], opts)
				if err != nil {
					return rebuildError(err)
				}
				fmt.Fprintf(a.out, "rebuild %d of %s v%d requested (%s, %d events in the log)\n", rb.ID, rb.Name, rb.Version, rb.Mode, rb.TotalEvents)
				switch {
				case diff:
					r, err := a.followRebuild(cmd, store, rb, pickup, true)
					if err != nil {
						return err
					}
					if r.Status != rebuild.Ready {
						return a.finishRebuild(cmd, store, r)
					}
					if err := a.reportParks(cmd, store, r); err != nil {
						return err
					}
					if err := a.printDiff(cmd, store, rb.Name, limit); err != nil {
						return err
					}
					fmt.Fprintf(a.out, "the rebuild is held: make it live with `%[1]s rebuild switch %[2]s`, or drop it with `%[1]s rebuild cancel %[2]s`\n",
						cmd.Root().Name(), rb.Name)
					return nil
				case wait:
					r, err := a.followRebuild(cmd, store, rb, pickup, false)
					if err != nil {
						return err
					}
					return a.finishRebuild(cmd, store, r)
				}
				fmt.Fprintf(a.out, "follow it with `%s rebuild list %s`\n", cmd.Root().Name(), rb.Name)
				return nil
			})
		},
	}
	cmd.Flags().BoolVar(&inPlace, "in-place", false, "clear the live tables and replay into them (readers see a partial model)")
	cmd.Flags().IntVar(&version, "version", 0, "projection version to build (default: the highest registered)")
	cmd.Flags().BoolVar(&hold, "hold", false, "blue/green: do not switch when caught up; wait for 'rebuild switch NAME'")
	cmd.Flags().BoolVar(&diff, "diff", false, "blue/green: hold the switch, follow the rebuild until it is ready and print what the switch would change")
	cmd.Flags().IntVar(&limit, "limit", rebuild.DefaultDiffLimit, fmt.Sprintf("with --diff: differing rows to show per table (1 to %d)", rebuild.MaxDiffLimit))
	cmd.Flags().BoolVar(&wait, "wait", false, "follow the rebuild to its end with a progress bar")
	cmd.Flags().BoolVar(&here, "here", false, "run the rebuild in this process (the binary must have the projection) until it has switched or is done")
	cmd.Flags().DurationVar(&pickup, "pickup-timeout", time.Minute, "with --wait or --diff: warn if no dispatcher has started the rebuild within this time (0: no limit)")
	partial = a.addPartialFlags(cmd)
	cmd.AddCommand(a.rebuildListCmd(), a.rebuildDiffCmd(), a.rebuildActionCmd("cancel", "Cancel a blue/green rebuild: drop its shadow tables (or index); the live model is untouched", a.cancelRebuild),
		a.rebuildActionCmd("switch", "Let a rebuild held with --hold switch once it has caught up (the dispatcher switches it; a cancel before then still cancels)", rebuild.Switch), a.rebuildDropOldCmd())
	return cmd
}

// checkDiffLimit range-checks --limit.
func checkDiffLimit(limit int) error {
	if limit < 1 || limit > rebuild.MaxDiffLimit {
		return usageError{fmt.Errorf("--limit %d: want 1 to %d rows per table", limit, rebuild.MaxDiffLimit)}
	}
	return nil
}

// rebuildError turns refusals into exit code 3 and names into usage errors.
func rebuildError(err error) error {
	switch {
	case errors.Is(err, rebuild.ErrUnknownProjection), errors.Is(err, rebuild.ErrDiffLimit):
		return usageError{err}
	case errors.Is(err, rebuild.ErrActive), errors.Is(err, rebuild.ErrNotActive), errors.Is(err, rebuild.ErrNoTables),
		errors.Is(err, rebuild.ErrNotRebuildable), errors.Is(err, rebuild.ErrPruned), errors.Is(err, rebuild.ErrNotReady),
		errors.Is(err, rebuild.ErrNoPrimaryKey), errors.Is(err, rebuild.ErrInlineVersion), errors.Is(err, rebuild.ErrHorizonHeld),
		errors.Is(err, rebuild.ErrMergeUnderWay), errors.Is(err, projection.ErrLayoutChanged):
		return refusedError{err}
	}
	return err
}

// refusedError marks an operation refused in the current state: exit 3.
type refusedError struct{ error }

func (r refusedError) Unwrap() error { return r.error }

// Is makes a refusal exit with ExitRefused like a refused transition.
func (r refusedError) Is(target error) bool { return target == projector.ErrInvalidTransition }

// withStore opens the pool and store for a command and runs fn.
func (a *App) withStore(cmd *cobra.Command, fn func(*postgres.Store) error) error {
	pool, err := a.Pool(cmd.Context())
	if err != nil {
		return err
	}
	defer pool.Close()
	store, err := a.Store(cmd.Context(), pool)
	if err != nil {
		return err
	}
	return fn(store)
}

// followRebuild shows a rebuild's progress until it ends (or, untilReady,
// until it is held at ready) and returns its last record: a bar on a
// terminal, a line every few seconds otherwise. A rebuild nobody has started
// within pickup (0: no limit) is reported once on standard error.
func (a *App) followRebuild(cmd *cobra.Command, store *postgres.Store, rb rebuild.Rebuild, pickup time.Duration, untilReady bool) (rebuild.Rebuild, error) {
	ctx := cmd.Context()
	tty := IsTerminal(a.out)
	var bar *progressbar.ProgressBar
	if tty {
		bar = progressbar.NewOptions64(max(rb.TotalEvents, 1), progressbar.OptionSetWriter(a.out),
			progressbar.OptionSetDescription("rebuild "+rb.Name), progressbar.OptionShowCount(), progressbar.OptionShowIts(),
			progressbar.OptionSetItsString("events"), progressbar.OptionSetWidth(30), progressbar.OptionThrottle(100*time.Millisecond),
			progressbar.OptionSetPredictTime(true))
	}
	started := time.Now()
	var lastLine time.Time
	var moved bool
	show := func(r rebuild.Rebuild, last bool) {
		done := r.TotalEvents - r.Remaining
		if r.Cursor != projector.Start || !r.Active() {
			moved = true
		}
		switch {
		case bar != nil:
			_ = bar.Set64(done)
		case time.Since(lastLine) >= 2*time.Second || last:
			lastLine = time.Now()
			fmt.Fprintf(a.out, "rebuild %s: %s, %d/%d events (%.0f%%)\n", r.Name, r.Status, done, r.TotalEvents, 100*r.Progress())
		}
		if pickup > 0 && !moved && time.Since(started) > pickup && r.Active() {
			err := fmt.Errorf("no dispatcher has started rebuild %d of %s v%d within %v: is a dispatcher with that version running (`projector run` in the binary that has the projection, or `rebuild %s --here` there)? The request stays; cancel it with `rebuild cancel %s`",
				r.ID, r.Name, r.Version, pickup, r.Name, r.Name)
			fmt.Fprintln(a.errOut, err)
			moved = true // say it once
		}
	}
	var r rebuild.Rebuild
	err := poll(ctx, 250*time.Millisecond, func() (bool, error) {
		var err error
		r, err = rebuild.Current(ctx, store, rb.Name)
		if err == nil && r.ID != rb.ID {
			err = fmt.Errorf("rebuild %d of %s is gone: rebuild %d replaced it", rb.ID, rb.Name, r.ID)
		}
		if err != nil {
			return false, err
		}
		last := !r.Active() || (untilReady && r.Status == rebuild.Ready)
		show(r, last)
		return last, nil
	})
	return r, stopped(bar, a.out, rb, err)
}

// stopped ends the progress bar and words why following stopped.
func stopped(bar *progressbar.ProgressBar, out io.Writer, rb rebuild.Rebuild, err error) error {
	if bar != nil {
		_ = bar.Finish()
		fmt.Fprintln(out)
	}
	if err != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
		return fmt.Errorf("stopped following rebuild %d of %s (it goes on in the dispatchers): %w", rb.ID, rb.Name, err)
	}
	return err
}

// endOfRebuild says how a rebuild that is no longer active ended: an error
// unless it switched or is done.
func endOfRebuild(out io.Writer, r rebuild.Rebuild) error {
	switch r.Status {
	case rebuild.Switched:
		fmt.Fprintf(out, "rebuild %d of %s switched: version %d is live (switch held the tables %v); old tables kept in schema %s until `rebuild drop-old %s`\n",
			r.ID, r.Name, r.Version, r.SwitchTook.Round(10*time.Microsecond), r.OldSchema, r.Name)
	case rebuild.Done:
		fmt.Fprintf(out, "rebuild %d of %s done: replayed in place\n", r.ID, r.Name)
	default:
		return fmt.Errorf("rebuild %d of %s ended %s", r.ID, r.Name, r.Status)
	}
	return nil
}

func (a *App) rebuildListCmd() *cobra.Command {
	var format string
	cmd := &cobra.Command{
		Use:   "list [NAME]",
		Short: "List rebuilds (of one projection) with their progress",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			asJSON, err := outputFormat(format)
			if err != nil {
				return err
			}
			name := ""
			if len(args) == 1 {
				name = args[0]
				if err := checkName("projection", name); err != nil {
					return err
				}
			}
			return a.withStore(cmd, func(store *postgres.Store) error {
				rs, err := rebuild.List(cmd.Context(), store, name)
				if err != nil {
					return err
				}
				return WriteRebuilds(a.out, rs, asJSON)
			})
		},
	}
	cmd.Flags().StringVarP(&format, "output", "o", "table", "output format: table or json")
	return cmd
}

func (a *App) rebuildActionCmd(use, short string, fn func(ctx context.Context, store *postgres.Store, name string) error) *cobra.Command {
	return &cobra.Command{
		Use:   use + " NAME",
		Short: short,
		Args:  exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkName("projection", args[0]); err != nil {
				return err
			}
			return a.withStore(cmd, func(store *postgres.Store) error {
				if err := fn(cmd.Context(), store, args[0]); err != nil {
					return rebuildError(err)
				}
				if use == "switch" {
					// Switch releases the hold; the dispatcher building the
					// rebuild switches at its next pass once caught up. Said
					// as done, a cancel meanwhile (which it does not refuse)
					// left the operator told of a switch that never came (an
					// operators' race test).
					fmt.Fprintf(a.out, "rebuild of %s: switch released; the dispatcher building it switches once it has caught up "+
						"(at once if ready): follow with `%s rebuild list %s`\n", projector.Printable(args[0]), cmd.Root().Name(), projector.Printable(args[0]))
					return nil
				}
				fmt.Fprintf(a.out, "rebuild of %s: %s done\n", projector.Printable(args[0]), use)
				return nil
			})
		},
	}
}

func (a *App) rebuildDropOldCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "drop-old NAME",
		Short: "Drop the tables blue/green switches of NAME replaced",
		Args:  exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.withStore(cmd, func(store *postgres.Store) error {
				dropped, err := rebuild.DropOld(cmd.Context(), store, args[0])
				if err != nil {
					return rebuildError(err)
				}
				if len(dropped) == 0 {
					fmt.Fprintf(a.out, "no old tables of %s to drop\n", args[0])
					return nil
				}
				fmt.Fprintf(a.out, "dropped %s\n", strings.Join(dropped, ", "))
				return nil
			})
		},
	}
}

// RebuildJSON is a rebuild as `rebuild list -o json` prints it.
type RebuildJSON struct {
	ID           int64    `json:"id"`
	Name         string   `json:"name"`
	Version      int      `json:"version"`
	Mode         string   `json:"mode"`
	Status       string   `json:"status"`
	Hold         bool     `json:"hold"`
	Tables       []string `json:"tables"`
	Progress     float64  `json:"progress"`
	Done         int64    `json:"events_done"`
	Total        int64    `json:"events_total"`
	ShadowSchema string   `json:"shadow_schema,omitempty"`
	OldSchema    string   `json:"old_schema,omitempty"`
	RequestedAt  string   `json:"requested_at"`
	FinishedAt   string   `json:"finished_at,omitempty"`
	SwitchMS     float64  `json:"switch_ms,omitempty"`
}

// WriteRebuilds prints rebuilds as a table or JSON.
func WriteRebuilds(w io.Writer, rs []rebuild.Rebuild, asJSON bool) error {
	if asJSON {
		out := make([]RebuildJSON, len(rs))
		for i, r := range rs {
			out[i] = rebuildJSON(r)
		}
		return writeJSON(w, out)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tPROJECTION\tVERSION\tMODE\tSTATUS\tPROGRESS\tREQUESTED\tOLD TABLES")
	for _, r := range rs {
		old := r.OldSchema
		if old == "" {
			old = "-"
		}
		fmt.Fprintf(tw, "%d\t%s\tv%d\t%s\t%s\t%.0f%% (%d/%d)\t%s\t%s\n", r.ID, r.Name, r.Version, r.Mode, r.Status,
			100*r.Progress(), r.TotalEvents-r.Remaining, r.TotalEvents, r.RequestedAt.Format(time.RFC3339), old)
	}
	return tw.Flush()
}

func rebuildJSON(r rebuild.Rebuild) RebuildJSON {
	out := RebuildJSON{ID: r.ID, Name: r.Name, Version: r.Version, Mode: string(r.Mode), Status: string(r.Status), Hold: r.Hold,
		Tables: r.Tables, Progress: r.Progress(), Done: r.TotalEvents - r.Remaining, Total: r.TotalEvents,
		ShadowSchema: r.ShadowSchema, OldSchema: r.OldSchema, RequestedAt: r.RequestedAt.Format(time.RFC3339),
		SwitchMS: float64(r.SwitchTook.Microseconds()) / 1000}
	if !r.FinishedAt.IsZero() {
		out.FinishedAt = r.FinishedAt.Format(time.RFC3339)
	}
	return out
}

func (a *App) rebuildDiffCmd() *cobra.Command {
	var format string
	var limit int
	cmd := &cobra.Command{
		Use:   "diff NAME",
		Short: "Compare a held rebuild's shadow tables with the live ones: what the switch would change",
		Long: `diff NAME compares, for each table the projection declares, the shadow table of
its blue/green rebuild with the live one, once the rebuild is ready (requested with
--hold or --diff and caught up): row counts, and the first rows by primary key that
are missing from the shadow table (the switch removes them), extra in it (the
switch adds them) or changed, with the columns that differ. Both models are read in
one snapshot at the same position of the log when one can be found (the output says
otherwise). Refused (exit 3) when no rebuild is ready or a table has no primary key.`,
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			asJSON, err := outputFormat(format)
			if err != nil {
				return err
			}
			if err := checkDiffLimit(limit); err != nil {
				return err
			}
			return a.withStore(cmd, func(store *postgres.Store) error {
				d, err := rebuild.Diff(cmd.Context(), store, args[0], limit)
				if err != nil {
					return rebuildError(err)
				}
				if asJSON {
					return writeJSON(a.out, diffJSON(d))
				}
				return WriteDiff(a.out, d)
			})
		},
	}
	cmd.Flags().StringVarP(&format, "output", "o", "table", "output format: table or json")
	cmd.Flags().IntVar(&limit, "limit", rebuild.DefaultDiffLimit, fmt.Sprintf("differing rows to show per table (1 to %d)", rebuild.MaxDiffLimit))
	return cmd
}

// printDiff prints the diff of name's ready rebuild.
func (a *App) printDiff(cmd *cobra.Command, store *postgres.Store, name string, limit int) error {
	d, err := rebuild.Diff(cmd.Context(), store, name, limit)
	if err != nil {
		return fmt.Errorf("%w; the rebuild stays held: switch it with `%s rebuild switch %s` or cancel it", rebuildError(err), cmd.Root().Name(), name)
	}
	return WriteDiff(a.out, d)
}

// DiffJSON is a diff as `rebuild diff -o json` prints it.
type DiffJSON struct {
	Rebuild       RebuildJSON         `json:"rebuild"`
	LiveCursor    string              `json:"live_cursor"`
	ShadowCursor  string              `json:"shadow_cursor"`
	EventsBetween int64               `json:"events_between"`
	Same          bool                `json:"same"`
	Tables        []rebuild.TableDiff `json:"tables"`
}

func diffJSON(d rebuild.Difference) DiffJSON {
	return DiffJSON{Rebuild: rebuildJSON(d.Rebuild), LiveCursor: cursor(d.LiveCursor), ShadowCursor: cursor(d.ShadowCursor),
		EventsBetween: d.EventsBetween, Same: d.Same(), Tables: d.Tables}
}

// WriteDiff prints a diff for an operator: where both models were read, a
// line of counts per table, and the first differing rows of each.
func WriteDiff(w io.Writer, d rebuild.Difference) error {
	rb := d.Rebuild
	fmt.Fprintf(w, "rebuild %d of %s v%d (%s): shadow tables in %s, live model at %s, shadow at %s\n",
		rb.ID, rb.Name, rb.Version, rb.Status, rb.ShadowSchema, cursor(d.LiveCursor), cursor(d.ShadowCursor))
	if d.EventsBetween == 0 {
		fmt.Fprintln(w, "both models have applied the same events: every difference below comes from the new version")
	} else {
		fmt.Fprintf(w, "note: %d events the projection handles lie between the two models (events kept arriving); rows they touch may differ for that alone: diff again when the log is quieter\n",
			d.EventsBetween)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "TABLE\tKEY\tLIVE ROWS\tSHADOW ROWS\tMISSING\tEXTRA\tCHANGED")
	for _, t := range d.Tables {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%d\n", t.Table, strings.Join(t.Key, ","), t.LiveRows, t.ShadowRows, t.Missing, t.Extra, t.Changed)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if d.Same() {
		fmt.Fprintln(w, "no differences: the switch changes nothing readers see")
		return nil
	}
	for _, t := range d.Tables {
		if len(t.LiveOnlyColumns) > 0 {
			fmt.Fprintf(w, "%s: columns only the live table has (gone after the switch): %s\n", t.Table, strings.Join(t.LiveOnlyColumns, ", "))
		}
		if len(t.ShadowOnlyColumns) > 0 {
			fmt.Fprintf(w, "%s: columns only the shadow table has (new after the switch): %s\n", t.Table, strings.Join(t.ShadowOnlyColumns, ", "))
		}
		if len(t.Rows) == 0 {
			continue
		}
		shown := fmt.Sprintf("first %d", len(t.Rows))
		if total := t.Missing + t.Extra + t.Changed; int64(len(t.Rows)) == total {
			shown = fmt.Sprintf("all %d", total)
		}
		fmt.Fprintf(w, "%s, %s differing rows by primary key (missing: only live, the switch removes it; extra: only in the shadow, the switch adds it):\n", t.Table, shown)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		for _, r := range t.Rows {
			key := make([]string, len(r.Key))
			for i, v := range r.Key {
				key[i] = t.Key[i] + "=" + diffValue(v)
			}
			var change []string
			for _, c := range r.Columns {
				change = append(change, c+": "+diffValue(r.Live[c])+" -> "+diffValue(r.Shadow[c]))
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\n", r.Kind, strings.Join(key, " "), strings.Join(change, "; "))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	return nil
}

// diffValue renders a value of a diff compactly, on one line, cut at 40
// characters.
func diffValue(v any) string {
	s := ""
	switch x := v.(type) {
	case string:
		s = strconv.Quote(x)
	default:
		b, err := json.Marshal(x)
		if err != nil {
			s = fmt.Sprint(x)
		} else {
			s = string(b)
		}
	}
	if r := []rune(s); len(r) > 40 {
		s = string(r[:39]) + "…"
	}
	return s
}

// rebuildHere is `rebuild NAME --here`: it runs a dispatcher with only the
// projection NAME in this process, requests the rebuild (or resumes one of
// the same version and mode that is still in progress, as after a Ctrl-C),
// follows it to its end and stops the dispatcher. With diff it prints the
// diff once the rebuild is ready and keeps the shadow tables current until
// an operator switches or cancels it.
func (a *App) rebuildHere(cmd *cobra.Command, name string, opts rebuild.Options, diff bool, limit int) error {
	ctx := cmd.Context()
	w, err := a.wiring()
	if err != nil {
		return err
	}
	var p *projection.Async
	var have []string
	for _, x := range w.Async {
		have = append(have, x.Name())
		if x.Name() == name {
			p = x
		}
	}
	for _, x := range w.Inline {
		if ip, ok := x.(*projection.Inline); ok && p == nil {
			have = append(have, ip.Name()+" (inline)")
			if ip.Name() == name {
				return a.rebuildHereInline(cmd, ip, w, opts, diff)
			}
		}
	}
	if p == nil {
		if len(have) == 0 {
			have = []string{"none"}
		}
		return usageError{fmt.Errorf("--here: this binary has no async projection %s (it has: %s); run the command in the binary that has it compiled in (cli.Config.Wire), or drop --here so the dispatchers running it carry the rebuild out",
			projector.Printable(name), strings.Join(have, ", "))}
	}
	cfg := p.Config()
	if opts.Version != 0 && opts.Version != cfg.Version {
		return usageError{fmt.Errorf("--here builds the version of %s this binary has (v%d), not --version %d", name, cfg.Version, opts.Version)}
	}
	opts.Version = cfg.Version
	pool, err := a.Pool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	if w.Setup != nil {
		if err := w.Setup(ctx, pool); err != nil {
			return fmt.Errorf("set up the application's tables: %w", err)
		}
	}
	store, err := a.Store(ctx, pool)
	if err != nil {
		return err
	}
	// Refuse what Request would refuse before a dispatcher starts: a
	// dispatcher builds a projection without a consumer from the start,
	// which is not what was asked.
	var exists bool
	if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+store.Table("projector_consumers")+` WHERE name = $1 AND instance_id = $2)`,
		name, projection.SharedInstance).Scan(&exists); err != nil {
		return fmt.Errorf("rebuild %s: %w", name, err)
	}
	switch {
	case cfg.Delivery != projection.Shared:
		return refusedError{fmt.Errorf("%w: %s is a per-instance consumer: its state lives in each process, not in tables", rebuild.ErrNotRebuildable, name)}
	case len(cfg.Tables) == 0:
		return refusedError{fmt.Errorf("%w: %s declares no read-model tables (projection.AsyncConfig.Tables)", rebuild.ErrNoTables, name)}
	case !exists:
		return refusedError{fmt.Errorf("%w: projection %s has no consumer yet; `%s run` builds it from the start, no rebuild needed", rebuild.ErrNotRebuildable, name, cmd.Root().Name())}
	}
	current, err := rebuild.Current(ctx, store, name)
	resume := err == nil && current.Active()
	if err != nil && !errors.Is(err, projector.ErrNotFound) {
		return err
	}
	if resume && (current.Version != cfg.Version || current.Mode != opts.Mode || (diff && !current.Hold)) {
		held := ""
		if current.Hold {
			held = ", held for a switch"
		}
		return refusedError{fmt.Errorf("%w: rebuild %d of %s (v%d, %s%s), which --here with this binary's v%d cannot carry on; follow it with `%s rebuild list %s`, or cancel it",
			rebuild.ErrActive, current.ID, name, current.Version, current.Mode, held, cfg.Version, cmd.Root().Name(), name)}
	}

	d, err := projection.New(projection.Config{Store: store, Projections: []*projection.Async{p}, Logger: a.logger()})
	if err != nil {
		return err
	}
	if err := d.Start(ctx); err != nil {
		return err
	}
	defer func() {
		stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if err := d.Stop(stopCtx); err != nil {
			fmt.Fprintf(a.errOut, "%s rebuild: stopping the dispatcher: %v\n", cmd.Root().Name(), err)
		}
	}()
	rb := current
	if resume {
		fmt.Fprintf(a.out, "resuming rebuild %d of %s v%d (%s) in this process\n", rb.ID, rb.Name, rb.Version, rb.Mode)
	} else {
		if rb, err = rebuild.Request(ctx, store, name, opts); err != nil {
			return rebuildError(err)
		}
		fmt.Fprintf(a.out, "rebuild %d of %s v%d requested (%s, %d events in the log); running it in this process\n", rb.ID, rb.Name, rb.Version, rb.Mode, rb.TotalEvents)
	}
	here := func(err error) error {
		if ctx.Err() != nil {
			return fmt.Errorf("stopped rebuild %d of %s here: it resumes from its cursor in the next dispatcher of %s v%d (`rebuild %s --here` again, or `run`): %w",
				rb.ID, name, name, cfg.Version, name, ctx.Err())
		}
		return err
	}
	r := rb
	if rb.Hold {
		if r, err = a.followRebuild(cmd, store, rb, 0, true); err != nil {
			return here(err)
		}
		if r.Status == rebuild.Ready {
			if err := a.reportParks(cmd, store, r); err != nil {
				return here(err)
			}
			if diff {
				if err := a.printDiff(cmd, store, name, limit); err != nil {
					return here(err)
				}
			}
			fmt.Fprintf(a.out, "the rebuild is held: make it live with `%[1]s rebuild switch %[2]s`, or drop it with `%[1]s rebuild cancel %[2]s`, from another terminal; "+
				"this process keeps the shadow tables current until then\n", cmd.Root().Name(), name)
		}
	}
	if r.Active() {
		if r, err = a.followRebuild(cmd, store, rb, 0, false); err != nil {
			return here(err)
		}
	}
	if r.Status == rebuild.Switched {
		// The shadow stopped at the live cursor: the events after it are
		// the new version's to handle live (docs/rebuilds.md), here as the
		// consumer's next dispatcher would, so the model is whole.
		if err := d.CatchUp(ctx); err != nil {
			return here(fmt.Errorf("rebuild %d of %s switched; catching the live consumer up: %w", r.ID, name, err))
		}
	}
	return a.finishRebuild(cmd, store, r)
}

// rebuildHereInline is `rebuild NAME --here` for an inline projection: it
// carries out the projection's recorded rebuild (requested by `rebuild
// NAME`, or one this process records now) in this process, with the tables
// the projection declares, showing its progress, until it has switched.
// Interrupted, it stays in progress and resumes from its cursor.
func (a *App) rebuildHereInline(cmd *cobra.Command, p *projection.Inline, w Wiring, opts rebuild.Options, diff bool) error {
	ctx := cmd.Context()
	name := p.Name()
	switch {
	case opts.Mode == rebuild.InPlace, opts.Hold || diff:
		return usageError{fmt.Errorf("--here: %s is an inline projection: it is rebuilt into shadow tables and switched as soon as it has caught up; --in-place, --hold and --diff do not apply", name)}
	case opts.Version != 0 && opts.Version != p.Version():
		return usageError{fmt.Errorf("--here builds the version of %s this binary has (v%d), not --version %d", name, p.Version(), opts.Version)}
	case len(p.Tables()) == 0:
		return refusedError{fmt.Errorf("%w: inline %s declares no tables (projection.Inline.SetTables)", rebuild.ErrNoTables, name)}
	}
	pool, err := a.Pool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	if w.Setup != nil {
		if err := w.Setup(ctx, pool); err != nil {
			return fmt.Errorf("set up the application's tables: %w", err)
		}
	}
	store, err := a.Store(ctx, pool)
	if err != nil {
		return err
	}
	type outcome struct {
		res rebuild.InlineResult
		err error
	}
	done := make(chan outcome, 1)
	// Following stops when the run does, whether it switched or failed
	// (a failed rebuild stays in progress: following it would not end).
	followCtx, stopFollowing := context.WithCancel(ctx)
	defer stopFollowing()
	go func() {
		res, err := rebuild.Inline(ctx, store, p, rebuild.InlineOptions{})
		if err != nil {
			stopFollowing()
		}
		done <- outcome{res, err}
	}()
	// Follow the record once the run has one (it refuses before that).
	var (
		rb       rebuild.Rebuild
		finished *outcome // the run's outcome, when it ended before the record was seen
	)
	ticker := time.NewTicker(100 * time.Millisecond)
	defer ticker.Stop()
	for rb.ID == 0 {
		select {
		case o := <-done:
			if o.err != nil {
				return rebuildError(o.err)
			}
			finished = &o
			rb, err = rebuild.Current(ctx, store, name)
			if err != nil {
				return err
			}
		case <-ticker.C:
			r, err := rebuild.Current(ctx, store, name)
			if err == nil && r.Active() && r.Mode == rebuild.InlineRebuild {
				rb = r
			}
		}
	}
	fmt.Fprintf(a.out, "rebuild %d of inline %s v%d (%d events in the log when requested); running it in this process\n", rb.ID, name, rb.Version, rb.TotalEvents)
	cmd.SetContext(followCtx)
	r, ferr := a.followRebuild(cmd, store, rb, 0, false)
	cmd.SetContext(ctx)
	var o outcome
	if finished != nil {
		o = *finished
	} else {
		o = <-done
	}
	if o.err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("stopped rebuild %d of %s here: it resumes from its cursor with `rebuild %s --here` again, or in `run`: %w", rb.ID, name, name, ctx.Err())
		}
		return rebuildError(o.err)
	}
	if ferr != nil {
		return ferr
	}
	if err := endOfRebuild(a.out, r); err != nil {
		return err
	}
	fmt.Fprintf(a.out, "%d events replayed in batches, %d under the lock; the lock was held %v\n", o.res.Replayed, o.res.CaughtUp, o.res.LockHeld.Round(10*time.Microsecond))
	return nil
}
