package cli

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/stores/postgres"
)

// maxRepairLockTimeout bounds --lock-timeout: PostgreSQL's lock_timeout
// holds under 25 days of milliseconds, and a repair is run by someone
// watching it.
const maxRepairLockTimeout = 24 * time.Hour

func (a *App) repairCmd() *cobra.Command {
	root := group("repair", "Repair Projector's tables after an out-of-the-ordinary event (restored-cluster)")
	var opts postgres.RepairOptions
	restored := &cobra.Command{
		Use:   "restored-cluster",
		Short: "Renumber the log and every cursor after a pg_dump was restored into a different cluster",
		Long: `A pg_dump restored into a different cluster carries the old cluster's transaction
ids, which may be ahead of the new server's: new events would sort before old ones
and consumers past them would never see them, so the store refuses to start.

This command renumbers every event to transaction ` + fmt.Sprint(postgres.RepairTxID) + ` (below every id a server
hands out) in its existing order and moves every consumer cursor, failing-event
position, dead letter and stream head with it, exactly: each consumer afterwards
sees precisely the events it had not seen yet. All in one transaction.

Stop every dispatcher and application process on the schema first; the command
waits --lock-timeout for the tables and gives up otherwise. It refuses (exit 3)
when no stored transaction id is from the future, unless --force. --dry-run does
the whole repair, prints the report and rolls it back.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if opts.LockTimeout <= 0 || opts.LockTimeout > maxRepairLockTimeout {
				return usageError{fmt.Errorf("--lock-timeout %v: want more than 0, up to %v", opts.LockTimeout, maxRepairLockTimeout)}
			}
			pool, err := a.Pool(cmd.Context())
			if err != nil {
				return err
			}
			defer pool.Close()
			start := time.Now()
			rep, err := postgres.RepairRestoredCluster(cmd.Context(), pool, a.schema, opts)
			if err != nil {
				return err
			}
			return writeRepair(a.out, rep, time.Since(start))
		},
	}
	restored.Flags().BoolVar(&opts.DryRun, "dry-run", false, "carry out the repair and roll it back: report only, change nothing")
	restored.Flags().BoolVar(&opts.Force, "force", false, "repair even if no stored transaction id is from the future")
	restored.Flags().DurationVar(&opts.LockTimeout, "lock-timeout", postgres.DefaultRepairLockTimeout, "how long to wait for Projector's tables")
	root.AddCommand(restored)
	return root
}

// writeRepair renders a repair report for an operator.
func writeRepair(w io.Writer, rep postgres.RepairReport, took time.Duration) error {
	switch {
	case rep.Restored:
		fmt.Fprintf(w, "schema %s: restored from another cluster: stored transaction id %d (%s) is at or past this server's next, %d\n",
			rep.Schema, rep.NewestTxID, rep.NewestIn, rep.NextTxID)
	case rep.NewestIn == "":
		fmt.Fprintf(w, "schema %s: stores no transaction ids; renumbering anyway (--force)\n", rep.Schema)
	default:
		fmt.Fprintf(w, "schema %s: not restored from another cluster (newest stored transaction id %d in %s, next %d); renumbering anyway (--force)\n",
			rep.Schema, rep.NewestTxID, rep.NewestIn, rep.NextTxID)
	}
	did := "repair"
	if rep.DryRun {
		did = "dry run (would do)"
	}
	events := "no events"
	if rep.Events > 0 {
		events = fmt.Sprintf("%d events, renumbered %d/1…%d/%d in their old order", rep.Events, postgres.RepairTxID, postgres.RepairTxID, rep.Events)
	}
	fmt.Fprintf(w, "%s: %s; %d stream heads reset to transaction %d; %d dead letters remapped\n\n",
		did, events, rep.Streams, postgres.RepairTxID, rep.DeadLetters)
	if len(rep.Consumers) == 0 {
		fmt.Fprintln(w, "no consumers registered")
	} else {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "CONSUMER\tINSTANCE\tSTATUS\tCURSOR\tNEW CURSOR\tBEHIND\tSEES AGAIN\tFAILING AT")
		for _, c := range rep.Consumers {
			failing := "-"
			if c.OldFailedAt.TxID != 0 {
				failing = cursor(c.OldFailedAt) + " → " + cursor(c.NewFailedAt)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%d\t%s\n", projector.Printable(c.Consumer), projector.Printable(c.Instance), projector.Printable(c.Status),
				cursor(c.OldCursor), cursor(c.NewCursor), c.Behind, c.SeesAgain, failing)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	took = took.Round(time.Millisecond)
	if rep.DryRun {
		_, err := fmt.Fprintf(w, "\ndry run: nothing changed (took %v with the tables locked); run again without --dry-run to apply\n", took)
		return err
	}
	_, err := fmt.Fprintf(w, "\nrepaired in %v; every consumer resumes exactly where it was. Start the dispatchers; VACUUM ANALYZE %s.projector_events when convenient\n",
		took, rep.Schema)
	return err
}
