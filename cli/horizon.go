package cli

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

// horizonCmd is `horizon`: how far every consumer's horizon is held back
// and by which transaction of the cluster (docs/operations.md, the horizon
// runbook). `status` prints the same as its last lines, and `status -o
// json` under "horizon"; this command is the report alone.
func (a *App) horizonCmd() *cobra.Command {
	var format string
	cmd := &cobra.Command{
		Use:   "horizon",
		Short: "Show the horizon's age and the transaction holding it (a session of any database, or a prepared transaction)",
		Long: `Show the horizon's age and the transaction holding it. Consumers read only events of
transactions older than the oldest transaction still running in the cluster (transaction
ids are cluster-wide, so it may be a session of another database): while it stays open,
every consumer stops moving. The holder is shown with its pid, database, user,
application, state, transaction start and the first 200 characters of its query, or the
gid of a prepared transaction. Without pg_read_all_stats the command says what it
cannot see.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			asJSON, err := outputFormat(format)
			if err != nil {
				return err
			}
			return a.withStore(cmd, func(store *postgres.Store) error {
				rep, err := projection.Horizon(cmd.Context(), store.Pool())
				if err != nil {
					return err
				}
				if asJSON {
					if rep.Others == nil {
						rep.Others = []projection.HorizonHolder{}
					}
					return writeJSON(a.out, rep)
				}
				return WriteHorizon(a.out, rep, time.Now())
			})
		},
	}
	cmd.Flags().StringVarP(&format, "output", "o", "table", "output format: table or json")
	return cmd
}

// WriteHorizon renders a horizon report for people: its age, the holder
// with how to end it, and what the role could not see.
func WriteHorizon(w io.Writer, rep projection.HorizonReport, now time.Time) error {
	var b strings.Builder
	switch h := rep.Holder; {
	case h == nil:
		b.WriteString("HORIZON: no open transaction with an id holds it back\n")
	case h.Kind == projection.HolderPrepared:
		fmt.Fprintf(&b, "HORIZON: %s old, held by prepared transaction %q (xid %d) in database %s, owner %s, prepared %s\n",
			age(rep.AgeSeconds), projector.Printable(h.GID), h.TxID, projector.Printable(h.Database), projector.Printable(h.User), timestamp(h.Since, now))
		fmt.Fprintf(&b, "  a prepared transaction outlives its session: end it in database %s with COMMIT PREPARED or ROLLBACK PREPARED '%s'\n",
			projector.Printable(h.Database), strings.ReplaceAll(projector.Printable(h.GID), "'", "''"))
	default:
		fmt.Fprintf(&b, "HORIZON: %s old, held by session pid %d (xid %d) in database %s, user %s, application %q",
			age(rep.AgeSeconds), h.PID, h.TxID, projector.Printable(h.Database), projector.Printable(h.User), projector.Printable(h.ApplicationName))
		if !h.Hidden {
			fmt.Fprintf(&b, ", %s since %s\n", projector.Printable(h.State), timestamp(h.Since, now))
			if q := text(h.Query, lineText); q != "" {
				fmt.Fprintf(&b, "  query: %s\n", q)
			}
		} else {
			b.WriteString("\n")
		}
		fmt.Fprintf(&b, "  if it must go: SELECT pg_terminate_backend(%d);\n", h.PID)
	}
	if rep.Missing != "" {
		fmt.Fprintf(&b, "  not visible: %s\n", rep.Missing)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// writeStatusHorizon ends `status` with the horizon's holder.
func (a *App) writeStatusHorizon(ctx context.Context, store *postgres.Store) error {
	rep, err := projection.Horizon(ctx, store.Pool())
	if err != nil {
		return err
	}
	fmt.Fprintln(a.out)
	return WriteHorizon(a.out, rep, time.Now())
}
