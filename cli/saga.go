package cli

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/saga"
	"github.com/projectorhq/projector/stores/postgres"
)

// maxSagaList caps `saga list --limit`.
const maxSagaList = 10_000

func (a *App) sagaCmd() *cobra.Command {
	root := group("saga", "Inspect saga (process manager) instances (list, show, retry, prune)")
	root.Long = `Sagas keep one instance per correlation key, with a state, a status (active,
completed, failed, parked), pending timeouts and the steps that drove it. These
commands read them; retry reactivates a failed or parked instance; prune deletes
completed instances past a retention age.`
	root.AddCommand(a.sagaListCmd(), a.sagaShowCmd(), a.sagaRetryCmd(), a.sagaPruneCmd())
	return root
}

func (a *App) sagaListCmd() *cobra.Command {
	var format, tenant string
	var statuses []string
	var limit int
	cmd := &cobra.Command{
		Use:   "list NAME",
		Short: "List a saga's instances, most recently updated first",
		Args:  exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			asJSON, err := outputFormat(format)
			if err != nil {
				return err
			}
			if limit < 1 || limit > maxSagaList {
				return usageError{fmt.Errorf("--limit %d: want 1..%d", limit, maxSagaList)}
			}
			q := saga.ListQuery{Saga: args[0], Tenant: tenant, Limit: limit}
			for _, s := range statuses {
				for part := range strings.SplitSeq(s, ",") {
					st, err := saga.ParseStatus(strings.TrimSpace(part))
					if err != nil {
						return usageError{fmt.Errorf("--status: %w", err)}
					}
					q.Statuses = append(q.Statuses, st)
				}
			}
			return a.withStore(cmd, func(store *postgres.Store) error {
				list, err := saga.List(cmd.Context(), store, q)
				if errors.Is(err, saga.ErrInvalidArgument) {
					return usageError{err}
				}
				if err != nil {
					return err
				}
				if len(list) == 0 {
					// No instances: a saga no dispatcher ever ran here (its
					// consumer has no shard) is a name mistyped, said as an
					// unknown consumer is (exit 2), not an empty table.
					admin := projection.NewAdmin(store)
					shards, err := admin.List(cmd.Context(), args[0])
					if err != nil {
						return err
					}
					if len(shards) == 0 {
						return unknownConsumer(cmd.Context(), admin, args[0], fmt.Errorf("saga %s: %w", projector.Printable(args[0]), projector.ErrNotFound))
					}
				}
				if asJSON {
					if list == nil {
						list = []saga.InstanceInfo{}
					}
					return writeJSON(a.out, list)
				}
				return writeSagaList(a.out, list)
			})
		},
	}
	cmd.Flags().StringSliceVar(&statuses, "status", nil, "only instances in these statuses: active, completed, failed, parked (repeat or comma-separate)")
	cmd.Flags().StringVar(&tenant, "tenant", "", "only one tenant's instances")
	cmd.Flags().IntVar(&limit, "limit", 100, fmt.Sprintf("at most this many instances (1..%d)", maxSagaList))
	cmd.Flags().StringVarP(&format, "output", "o", "table", "output format: table or json")
	return cmd
}

func writeSagaList(w io.Writer, list []saga.InstanceInfo) error {
	now := time.Now()
	return writeTable(w, func(tw io.Writer) {
		fmt.Fprintln(tw, "KEY\tTENANT\tSTATUS\tSTEPS\tLATE\tUPDATED\tSTATE")
		for _, in := range list {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\t%s\n", projector.Printable(in.Key), projector.Printable(in.Tenant),
				projector.Printable(string(in.Status)), in.Version, in.LateEvents, ago(in.UpdatedAt, now), text(string(in.State), cellText))
		}
	})
}

func (a *App) sagaShowCmd() *cobra.Command {
	var format, tenant string
	cmd := &cobra.Command{
		Use:   "show NAME KEY",
		Short: "Show one instance: state, pending timeouts, the steps that drove it and the events it appended",
		Args:  exactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			asJSON, err := outputFormat(format)
			if err != nil {
				return err
			}
			return a.withStore(cmd, func(store *postgres.Store) error {
				in, err := saga.Show(cmd.Context(), store, args[0], tenant, args[1])
				if errors.Is(err, saga.ErrInvalidArgument) {
					return usageError{err}
				}
				if errors.Is(err, projector.ErrNotFound) {
					return fmt.Errorf("saga %s has no instance %s in tenant %s (`%s saga list %s` lists them)", projector.Printable(args[0]),
						quoted(args[1]), quoted(tenant), cmd.Root().Name(), projector.Printable(args[0]))
				}
				if err != nil {
					return err
				}
				personal, err := a.openSagaState(cmd.Context(), store, &in)
				if err != nil {
					return err
				}
				if asJSON {
					return writeJSON(a.out, struct {
						saga.InstanceDetail
						Personal string `json:"personal,omitempty"`
					}{in, personal})
				}
				return writeSagaInstance(a.out, in, personal)
			})
		},
	}
	cmd.Flags().StringVar(&tenant, "tenant", projector.SystemTenant, "the instance's tenant")
	cmd.Flags().StringVarP(&format, "output", "o", "table", "output format: table or json")
	return cmd
}

func writeSagaInstance(w io.Writer, in saga.InstanceDetail, personal string) error {
	now := time.Now()
	err := writeTable(w, func(tw io.Writer) {
		row := func(k, v string) { fmt.Fprintf(tw, "%s\t%s\n", k, v) }
		row("saga", projector.Printable(in.Saga))
		row("key", projector.Printable(in.Key))
		row("tenant", projector.Printable(in.Tenant))
		row("status", projector.Printable(string(in.Status)))
		row("steps", fmt.Sprint(in.Version))
		row("late events", fmt.Sprint(in.LateEvents))
		row("correlation id", in.CorrelationID.String())
		if in.LastError != "" {
			row("last error", text(in.LastError, lineText))
		}
		row("created", timestamp(in.CreatedAt, now))
		row("updated", timestamp(in.UpdatedAt, now))
		if !in.CompletedAt.IsZero() {
			row("completed", timestamp(in.CompletedAt, now))
		}
		if personal != "" {
			row("personal", text(personal, lineText))
		}
		row("state", projector.PrintableText(string(in.State), lineText))
	})
	if err != nil {
		return err
	}
	// A section with nothing in it says so in one line, not with a header
	// over no rows (a completed instance has neither timeouts nor, often,
	// appended events).
	if len(in.Timeouts) == 0 {
		fmt.Fprintln(w, "\nPending timeouts: none")
	} else {
		fmt.Fprintln(w, "\nPending timeouts:")
		err = writeTable(w, func(tw io.Writer) {
			fmt.Fprintln(tw, "NAME\tDUE\tATTEMPTS\tLAST ERROR")
			for _, t := range in.Timeouts {
				fmt.Fprintf(tw, "%s\t%s\t%d\t%s\n", projector.Printable(t.Name), timestamp(t.DueAt, now), t.Attempts, text(t.LastError, cellText))
			}
		})
		if err != nil {
			return err
		}
	}
	fmt.Fprintln(w, "\nSteps:")
	err = writeTable(w, func(tw io.Writer) {
		fmt.Fprintln(tw, "STEP\tCAUSE\tTYPE\tSTREAM\tCAUSE ID\tAPPENDED\tAT")
		for _, s := range in.Steps {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%d\t%s\n", s.Step, projector.Printable(s.Cause), projector.Printable(s.Type),
				projector.Printable(s.Stream), s.CauseID, s.Appended, timestamp(s.At, now))
		}
	})
	if err != nil {
		return err
	}
	if len(in.Appended) == 0 {
		_, err = fmt.Fprintln(w, "\nAppended events: none")
		return err
	}
	fmt.Fprintln(w, "\nAppended events:")
	return writeTable(w, func(tw io.Writer) {
		fmt.Fprintln(tw, "TYPE\tSTREAM\tVERSION\tID\tCAUSED BY")
		for _, e := range in.Appended {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", projector.Printable(e.Type), projector.Printable(e.Stream), e.Version, e.ID, e.CausationID)
		}
	})
}

func (a *App) sagaPruneCmd() *cobra.Command {
	var olderThan string
	cmd := &cobra.Command{
		Use:   "prune",
		Short: "Delete saga instances that completed more than --older-than ago, with their steps",
		Args:  exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if olderThan == "" {
				return usageError{errors.New("--older-than is required (30d, 12h, 90m)")}
			}
			age, err := parseAge(olderThan)
			if err != nil {
				return usageError{fmt.Errorf("--older-than: %w", err)}
			}
			return a.withStore(cmd, func(store *postgres.Store) error {
				n, err := saga.PruneCompleted(cmd.Context(), store, age)
				if err != nil {
					return err
				}
				fmt.Fprintf(a.out, "pruned %d completed saga instances older than %s\n", n, olderThan)
				return nil
			})
		},
	}
	cmd.Flags().StringVar(&olderThan, "older-than", "", "retention age of completed instances: 30d, 12h, 90m")
	return cmd
}
