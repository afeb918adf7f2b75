package cli

import (
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/projectorhq/projector/stores/postgres"
)

func (a *App) migrateCmd() *cobra.Command {
	up := &cobra.Command{
		Use:   "up",
		Short: "Apply every pending migration (safe to run from several processes at once)",
		Args:  noArgs,
		RunE:  a.migrateUp,
	}
	status := &cobra.Command{
		Use:   "status",
		Short: "List migrations and when each was applied",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			pool, err := a.Pool(cmd.Context())
			if err != nil {
				return err
			}
			defer pool.Close()
			st, err := postgres.MigrationStatus(cmd.Context(), pool, a.schema)
			if err != nil {
				return err
			}
			w := tabwriter.NewWriter(a.out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "VERSION\tNAME\tAPPLIED")
			for _, m := range st {
				applied := "pending"
				if m.Applied() {
					applied = m.AppliedAt.Local().Format(time.DateTime)
				}
				fmt.Fprintf(w, "%04d\t%s\t%s\n", m.Version, m.Name, applied)
			}
			return w.Flush()
		},
	}
	index := &cobra.Command{
		Use:   "partition-index",
		Short: "Create the events table's partition index that partitioned consumers need (CONCURRENTLY: appends go on)",
		Args:  noArgs,
		RunE:  a.migratePartitionIndex,
	}
	m := &cobra.Command{
		Use:   "migrate [up|status]",
		Short: "Create or update Projector's schema (default: up)",
		Args:  noArgs,
		RunE:  a.migrateUp,
	}
	m.AddCommand(up, status, index)
	return m
}

func (a *App) migrateUp(cmd *cobra.Command, _ []string) error {
	pool, err := a.Pool(cmd.Context())
	if err != nil {
		return err
	}
	defer pool.Close()
	applied, err := postgres.Migrate(cmd.Context(), pool, a.schema)
	if err != nil {
		return err
	}
	if len(applied) == 0 {
		fmt.Fprintf(a.out, "schema %s is up to date\n", a.schema)
		return nil
	}
	fmt.Fprintf(a.out, "schema %s: applied migrations %v\n", a.schema, applied)
	return nil
}

// migratePartitionIndex creates the partition index (Store.CreatePartitionIndex),
// which no migration creates: it costs every append, and only partitioned
// consumers need it (docs/scaling.md). Its role must own the events table.
func (a *App) migratePartitionIndex(cmd *cobra.Command, _ []string) error {
	return a.withStore(cmd, func(store *postgres.Store) error {
		if err := store.CheckPartitionIndex(cmd.Context()); err == nil {
			fmt.Fprintf(a.out, "schema %s: the partition index %s exists\n", a.schema, postgres.PartitionIndex)
			return nil
		}
		fmt.Fprintf(a.out, "schema %s: creating the partition index %s concurrently (appends go on; a large log takes a while)\n", a.schema, postgres.PartitionIndex)
		if err := store.CreatePartitionIndex(cmd.Context()); err != nil {
			return err
		}
		fmt.Fprintf(a.out, "schema %s: the partition index %s is ready\n", a.schema, postgres.PartitionIndex)
		return nil
	})
}
