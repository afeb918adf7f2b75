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
	m := &cobra.Command{
		Use:   "migrate [up|status]",
		Short: "Create or update Projector's schema (default: up)",
		Args:  noArgs,
		RunE:  a.migrateUp,
	}
	m.AddCommand(up, status)
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
