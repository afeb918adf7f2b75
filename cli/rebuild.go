package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/rebuild"
	"github.com/projectorhq/projector/stores/postgres"
)

func (a *App) rebuildCmd() *cobra.Command {
	var inPlace, hold, wait bool
	var version int
	var pickup time.Duration
	var partial *partialFlags // --tenant, --stream-type/--stream-id: rebuild_partial.go
	cmd := &cobra.Command{
		Use:   "rebuild NAME | rebuild {list|cancel|switch|drop-old} ...",
		Short: "Rebuild a projection from the log: blue/green (default) or in place",
		Long: `rebuild NAME records a rebuild of the projection NAME; the dispatchers that run
the projection carry it out (this binary needs only the database).

Blue/green (the default) builds the projection's version (--version, default the
highest a dispatcher has registered) into shadow tables while the live model keeps
serving, and switches atomically once it has caught up; --hold waits for
'rebuild switch NAME' instead, so the shadow tables can be compared first.
--in-place clears the live tables and replays into them: readers see an empty,
then partial model until it catches up (for development and small models).

--wait follows the rebuild to its end with a progress bar (plain lines when not a
terminal).

--tenant X, or --stream-type T --stream-id ID, rebuilds only what that tenant or
stream contributed, at once and in this process: it needs the projection's code,
so only an application's own binary (cli.Config.Wire) can run it. See
docs/rebuilds.md.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usageError{fmt.Errorf("rebuild needs the projection's NAME (or a subcommand: list, cancel, switch, drop-old)")}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if partial.set(cmd) {
				return a.runPartial(cmd, args[0], partial)
			}
			if version < 0 {
				return usageError{fmt.Errorf("--version %d: want a version of 1 or more (0: the highest registered)", version)}
			}
			if pickup < 0 || pickup > 24*time.Hour {
				return usageError{fmt.Errorf("--pickup-timeout %v: want 0 (no limit) up to 24h", pickup)}
			}
			opts := rebuild.Options{Version: version, Hold: hold, Mode: rebuild.BlueGreen}
			if inPlace {
				opts.Mode = rebuild.InPlace
			}
			return a.withStore(cmd, func(store *postgres.Store) error {
				rb, err := rebuild.Request(cmd.Context(), store, args[0], opts)
				if err != nil {
					return rebuildError(err)
				}
				fmt.Fprintf(a.out, "rebuild %d of %s v%d requested (%s, %d events in the log)\n", rb.ID, rb.Name, rb.Version, rb.Mode, rb.TotalEvents)
				if !wait {
					fmt.Fprintf(a.out, "follow it with `%s rebuild list %s`\n", cmd.Root().Name(), rb.Name)
					return nil
				}
				return a.followRebuild(cmd, store, rb, pickup)
			})
		},
	}
	cmd.Flags().BoolVar(&inPlace, "in-place", false, "clear the live tables and replay into them (readers see a partial model)")
	cmd.Flags().IntVar(&version, "version", 0, "projection version to build (default: the highest registered)")
	cmd.Flags().BoolVar(&hold, "hold", false, "blue/green: do not switch when caught up; wait for 'rebuild switch NAME'")
	cmd.Flags().BoolVar(&wait, "wait", false, "follow the rebuild to its end with a progress bar")
	partial = a.addPartialFlags(cmd)
	cmd.Flags().DurationVar(&pickup, "pickup-timeout", time.Minute, "with --wait: fail if no dispatcher has started the rebuild within this time (0: no limit)")
	cmd.AddCommand(a.rebuildListCmd(), a.rebuildActionCmd("cancel", "Cancel a blue/green rebuild: drop its shadow tables; the live model is untouched", rebuild.Cancel),
		a.rebuildActionCmd("switch", "Let a rebuild held with --hold switch once it has caught up", rebuild.Switch), a.rebuildDropOldCmd())
	return cmd
}

// rebuildError turns refusals into exit code 3 and names into usage errors.
func rebuildError(err error) error {
	switch {
	case errors.Is(err, rebuild.ErrUnknownProjection):
		return usageError{err}
	case errors.Is(err, rebuild.ErrActive), errors.Is(err, rebuild.ErrNotActive), errors.Is(err, rebuild.ErrNoTables),
		errors.Is(err, rebuild.ErrNotRebuildable), errors.Is(err, rebuild.ErrPruned):
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

// followRebuild shows a rebuild's progress until it ends: a bar on a
// terminal, a line every few seconds otherwise.
func (a *App) followRebuild(cmd *cobra.Command, store *postgres.Store, rb rebuild.Rebuild, pickup time.Duration) error {
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
	final, err := rebuild.Wait(ctx, store, rb.Name, 250*time.Millisecond, func(r rebuild.Rebuild) {
		done := r.TotalEvents - r.Remaining
		if r.Cursor != projector.Start || !r.Active() {
			moved = true
		}
		switch {
		case bar != nil:
			_ = bar.Set64(done)
		case time.Since(lastLine) >= 2*time.Second || !r.Active():
			lastLine = time.Now()
			fmt.Fprintf(a.out, "rebuild %s: %s, %d/%d events (%.0f%%)\n", r.Name, r.Status, done, r.TotalEvents, 100*r.Progress())
		}
		if pickup > 0 && !moved && time.Since(started) > pickup && r.Active() {
			err := fmt.Errorf("no dispatcher has started rebuild %d of %s v%d within %v: is a dispatcher with that version running (`projector run` in the binary that has the projection)? The request stays; cancel it with `rebuild cancel %s`",
				r.ID, r.Name, r.Version, pickup, r.Name)
			fmt.Fprintln(a.errOut, err)
			moved = true // say it once
		}
	})
	if bar != nil {
		_ = bar.Finish()
		fmt.Fprintln(a.out)
	}
	if errors.Is(err, ctx.Err()) && ctx.Err() != nil {
		return fmt.Errorf("stopped following rebuild %d of %s (it goes on in the dispatchers): %w", rb.ID, rb.Name, err)
	}
	if err != nil {
		return err
	}
	switch final.Status {
	case rebuild.Switched:
		fmt.Fprintf(a.out, "rebuild %d of %s switched: version %d is live (switch held the tables %v); old tables kept in schema %s until `rebuild drop-old %s`\n",
			final.ID, final.Name, final.Version, final.SwitchTook.Round(10*time.Microsecond), final.OldSchema, final.Name)
	case rebuild.Done:
		fmt.Fprintf(a.out, "rebuild %d of %s done: replayed in place\n", final.ID, final.Name)
	default:
		return fmt.Errorf("rebuild %d of %s ended %s", final.ID, final.Name, final.Status)
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
			return a.withStore(cmd, func(store *postgres.Store) error {
				if err := fn(cmd.Context(), store, args[0]); err != nil {
					return rebuildError(err)
				}
				fmt.Fprintf(a.out, "rebuild of %s: %s done\n", args[0], use)
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
					return err
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
			out[i] = RebuildJSON{ID: r.ID, Name: r.Name, Version: r.Version, Mode: string(r.Mode), Status: string(r.Status), Hold: r.Hold,
				Tables: r.Tables, Progress: r.Progress(), Done: r.TotalEvents - r.Remaining, Total: r.TotalEvents,
				ShadowSchema: r.ShadowSchema, OldSchema: r.OldSchema, RequestedAt: r.RequestedAt.Format(time.RFC3339),
				SwitchMS: float64(r.SwitchTook.Microseconds()) / 1000}
			if !r.FinishedAt.IsZero() {
				out[i].FinishedAt = r.FinishedAt.Format(time.RFC3339)
			}
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
