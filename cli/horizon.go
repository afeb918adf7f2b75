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

// HorizonThreshold is the age from which the horizon line names the
// transaction holding the horizon and says how to end it. Below it the
// holder is ordinary traffic: every transaction that writes holds the
// horizon while it runs, and naming a 40ms one accuses an innocent.
const HorizonThreshold = 5 * time.Second

// WriteHorizon renders a horizon report for people: its age and, once it
// is HorizonThreshold old, the holder with how to end it (never for
// Projector's own sessions, which end by themselves), and what the role
// could not see.
func WriteHorizon(w io.Writer, rep projection.HorizonReport, now time.Time) error {
	var b strings.Builder
	h := rep.Holder
	old := time.Duration(rep.AgeSeconds * float64(time.Second))
	switch {
	case h == nil && rep.AgeSeconds <= 0:
		if rep.Missing != "" {
			b.WriteString("HORIZON: held by a transaction this role cannot see\n")
		} else {
			b.WriteString("HORIZON: no open transaction with an id holds it back\n")
		}
	case h == nil:
		fmt.Fprintf(&b, "HORIZON: %s old, held by a transaction this role cannot see\n", human(old))
	case h.Hidden:
		// Its transaction start is hidden, so its age is unknown: named,
		// since it may be old, but with no advice to end it.
		fmt.Fprintf(&b, "HORIZON: held by session pid %d (xid %d) of another role in %s, user %s, application %s; its age is not visible\n",
			h.PID, h.TxID, database(h.Database, rep.Database), projector.Printable(h.User), quoted(h.ApplicationName))
	case old < HorizonThreshold:
		fmt.Fprintf(&b, "HORIZON: %s old: no transaction holds it back for long (a holder is named from %s)\n", human(old), human(HorizonThreshold))
	case h.Kind == projection.HolderPrepared:
		fmt.Fprintf(&b, "HORIZON: %s old, held by prepared transaction %s (xid %d) in %s, owner %s, prepared %s\n",
			human(old), quoted(h.GID), h.TxID, database(h.Database, rep.Database), projector.Printable(h.User), timestamp(h.Since, now))
		fmt.Fprintf(&b, "  a prepared transaction outlives its session: end it in database %s with COMMIT PREPARED or ROLLBACK PREPARED '%s'\n",
			projector.Printable(h.Database), strings.ReplaceAll(projector.Printable(h.GID), "'", "''"))
	default:
		fmt.Fprintf(&b, "HORIZON: %s old, held by session pid %d (xid %d) in %s, user %s, application %s, %s since %s\n",
			human(old), h.PID, h.TxID, database(h.Database, rep.Database), projector.Printable(h.User), quoted(h.ApplicationName),
			projector.Printable(h.State), timestamp(h.Since, now))
		if q := text(h.Query, lineText); q != "" {
			fmt.Fprintf(&b, "  query: %s\n", q)
		}
		if IsProjectorApplication(h.ApplicationName) {
			b.WriteString("  this is Projector's own work (a rebuild's batch or a dispatcher pass): it ends when its batch commits; do not terminate it\n")
		} else {
			fmt.Fprintf(&b, "  if it must go: SELECT pg_terminate_backend(%d);\n", h.PID)
		}
	}
	if rep.Missing != "" {
		fmt.Fprintf(&b, "  not visible: %s\n", rep.Missing)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// database names a holder's database, saying so when it is not the one
// the report was taken from (here).
func database(db, here string) string {
	if here != "" && db != here {
		return fmt.Sprintf("another database, %s (transaction ids are cluster-wide)", projector.Printable(db))
	}
	return "database " + projector.Printable(db)
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
