package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/projection"
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
}

func toJSON(s projection.ShardState) ShardJSON {
	j := ShardJSON{
		Consumer: s.Consumer, Instance: s.Instance, Status: string(s.Status), Cursor: s.Cursor.String(),
		LagEvents: s.LagEvents, LagSeconds: s.LagSeconds, Attempts: s.Attempts, LastError: s.LastError,
		Processed: s.Processed, UpdatedAt: s.UpdatedAt,
	}
	if !s.LastErrorAt.IsZero() {
		j.LastErrorAt = &s.LastErrorAt
	}
	if !s.NextRetryAt.IsZero() {
		j.NextRetryAt = &s.NextRetryAt
	}
	if s.FailedAt.TxID != 0 {
		j.FailedAt = s.FailedAt.String()
	}
	return j
}

// WriteStatus renders shards as the `status` command does: a table readable
// at a glance, or JSON for scripts.
func WriteStatus(w io.Writer, shards []projection.ShardState, asJSON bool) error {
	if asJSON {
		out := make([]ShardJSON, len(shards))
		for i, s := range shards {
			out[i] = toJSON(s)
		}
		return writeJSON(w, out)
	}
	if len(shards) == 0 {
		_, err := fmt.Fprintln(w, "no consumers registered yet (they appear when a dispatcher first starts)")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CONSUMER\tINSTANCE\tSTATUS\tCURSOR\tLAG\tLAG AGE\tATTEMPTS\tLAST ERROR")
	for _, s := range shards {
		status := string(s.Status)
		if s.Failing() {
			status += " (failing)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%d\t%s\n", s.Consumer, s.Instance, status, cursor(s.Cursor),
			s.LagEvents, age(s.LagSeconds), s.Attempts, shorten(s.LastError, 60))
	}
	return tw.Flush()
}

// cursor renders a position for people: a cursor moved to the horizon
// (every event of transactions up to tx) reads "tx/max".
func cursor(p projector.Position) string {
	if p.Seq == math.MaxInt64 {
		return fmt.Sprintf("%d/max", p.TxID)
	}
	return p.String()
}

func age(seconds float64) string {
	if seconds <= 0 {
		return "-"
	}
	return (time.Duration(seconds * float64(time.Second))).Round(time.Millisecond).String()
}

func shorten(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) <= n {
		return s
	}
	return s[:n-1] + "…"
}

func (a *App) statusCmd() *cobra.Command {
	return a.listCmd("status", "Show every consumer shard: status, cursor, lag, attempts, last error")
}

// listCmd is `status` and `consumer list`: every shard, as a table or JSON.
func (a *App) listCmd(use, short string) *cobra.Command {
	var format string
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			asJSON, err := outputFormat(format)
			if err != nil {
				return err
			}
			return a.withAdmin(cmd, func(admin *projection.Admin) error {
				shards, err := admin.List(cmd.Context(), "")
				if err != nil {
					return err
				}
				return WriteStatus(a.out, shards, asJSON)
			})
		},
	}
	cmd.Flags().StringVarP(&format, "output", "o", "table", "output format: table or json")
	return cmd
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
	pool, err := a.Pool(cmd.Context())
	if err != nil {
		return err
	}
	defer pool.Close()
	store, err := a.Store(cmd.Context(), pool)
	if err != nil {
		return err
	}
	return fn(projection.NewAdmin(store))
}

// writeJSON writes v as indented JSON, the form every `-o json` takes.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func (a *App) consumerCmd() *cobra.Command {
	var instance, format string
	root := group("consumer", "Inspect and steer consumer shards (list, status, restart, skip, disable, enable)")
	root.Long = `Each async projection is a consumer with one shard (shared delivery) or one per
instance (per-instance delivery). These commands act on one shard: the shared one
unless --instance names another. A transition the shard's state does not allow is
refused with exit code 3 and changes nothing:

  restart   dead → idle, retrying the failing event
  skip      dead, or processing while an event is failing → idle, past the failing
            event, which is recorded in projector_dead_letters
  disable   idle, processing or dead → disabled (retention stops waiting for it)
  enable    disabled → idle`
	root.PersistentFlags().StringVar(&instance, "instance", projection.SharedInstance, "instance id of the shard (per-instance consumers)")

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
				st, err := admin.Status(cmd.Context(), projection.ShardID{Consumer: args[0], Instance: instance})
				if err != nil {
					return err
				}
				if asJSON {
					return writeJSON(a.out, toJSON(st))
				}
				return writeShard(a.out, st)
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
					id := projection.ShardID{Consumer: args[0], Instance: instance}
					if err := op.run(admin, cmd.Context(), id); err != nil {
						return err
					}
					st, err := admin.Status(cmd.Context(), id)
					if err != nil {
						return err
					}
					fmt.Fprintf(a.out, "%s %s: now %s at %s\n", op.use, id, st.Status, cursor(st.Cursor))
					return nil
				})
			},
		})
	}
	return root
}

func writeShard(w io.Writer, s projection.ShardState) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	row := func(k, v string) { fmt.Fprintf(tw, "%s\t%s\n", k, v) }
	row("consumer", s.Consumer)
	row("instance", s.Instance)
	row("status", string(s.Status))
	row("cursor", cursor(s.Cursor))
	row("lag", fmt.Sprintf("%d events, oldest %s", s.LagEvents, age(s.LagSeconds)))
	row("processed", fmt.Sprint(s.Processed))
	row("attempts", fmt.Sprint(s.Attempts))
	if s.LastError != "" {
		row("last error", s.LastError)
		row("last error at", s.LastErrorAt.Local().Format(time.RFC3339))
	}
	if s.FailedAt.TxID != 0 {
		row("failing event", fmt.Sprintf("%s at %s", s.FailedEventID, s.FailedAt))
	}
	if !s.NextRetryAt.IsZero() {
		row("next retry", s.NextRetryAt.Local().Format(time.RFC3339))
	}
	row("updated", s.UpdatedAt.Local().Format(time.RFC3339))
	return tw.Flush()
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
