package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/projectorhq/projector/cli"
	"github.com/projectorhq/projector/examples/helpdesk"
	"github.com/projectorhq/projector/internal/pgserver"
)

func demoCmd(getenv func(string) string) *cobra.Command {
	var cfg helpdesk.DemoConfig
	var throwaway bool
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run the helpdesk example end to end against a database it finds or starts",
		Long: `demo runs the example helpdesk application from start to finish.

It uses --database-url or PROJECTOR_DATABASE_URL when given, else a local
PostgreSQL if one answers, else it starts a throwaway PostgreSQL from the local
server binaries in a temporary directory and removes it afterwards.

It works in its own schema, --demo-schema (or --schema; default projector_demo),
which it creates and marks as its own, and drops and recreates on the next run.
It never drops a schema it did not create: pointed at one, it stops with an
error (exit 1) and changes nothing. PROJECTOR_SCHEMA is not used, so the demo
never lands in the schema your application uses.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			out := cmd.OutOrStdout()
			if cmd.Flags().Changed("schema") {
				schema, _ := cmd.Flags().GetString("schema")
				if cmd.Flags().Changed("demo-schema") && schema != cfg.Schema {
					return cli.Usage(fmt.Errorf("--schema %q and --demo-schema %q disagree: give one", schema, cfg.Schema))
				}
				cfg.Schema = schema
			}
			if cfg.Users < 1 || cfg.Users > helpdesk.MaxDemoUsers {
				return cli.Usage(fmt.Errorf("--users %d: want 1 to %d", cfg.Users, helpdesk.MaxDemoUsers))
			}
			if cfg.Actions < 1 || cfg.Actions > helpdesk.MaxDemoActions {
				return cli.Usage(fmt.Errorf("--actions %d: want 1 to %d", cfg.Actions, helpdesk.MaxDemoActions))
			}
			url, _ := cmd.Flags().GetString("database-url")
			url = cmp.Or(url, getenv(cli.EnvDatabaseURL))
			pool, cleanup, err := findDatabase(ctx, url, throwaway, out)
			if err != nil {
				return err
			}
			defer cleanup()
			cfg.Progress = cli.IsTerminal(out)
			return helpdesk.RunDemo(ctx, pool, out, cfg)
		},
	}
	cmd.Flags().StringVar(&cfg.Schema, "demo-schema", "projector_demo", "schema the demo creates, uses, and drops on its next run (only one it created)")
	cmd.Flags().IntVar(&cfg.Users, "users", 8, fmt.Sprintf("simulated customers and agents working at once (1 to %d)", helpdesk.MaxDemoUsers))
	cmd.Flags().IntVar(&cfg.Actions, "actions", 400, fmt.Sprintf("commands each simulated user sends (1 to %d)", helpdesk.MaxDemoActions))
	cmd.Flags().BoolVar(&throwaway, "throwaway", false, "always start a throwaway PostgreSQL, even if one answers")
	return cmd
}

// localCandidates are tried, in order, when no URL was given: the libpq
// defaults (PGHOST, PGUSER… or the local socket as the current user), then
// the stock superuser on the loopback port.
var localCandidates = []string{"", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"}

// findDatabase connects to url, or to a local server that answers, or to a
// throwaway cluster it starts; cleanup closes the pool and stops the cluster.
func findDatabase(ctx context.Context, url string, throwaway bool, out io.Writer) (*pgxpool.Pool, func(), error) {
	if throwaway {
		return startThrowaway(ctx, out)
	}
	if url != "" {
		pool, err := cli.Connect(ctx, url)
		if err != nil {
			return nil, nil, err
		}
		fmt.Fprintln(out, "using the database from --database-url / PROJECTOR_DATABASE_URL")
		return pool, pool.Close, nil
	}
	for _, c := range localCandidates {
		cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		pool, err := cli.Connect(cctx, c)
		cancel()
		if err == nil {
			cfg := pool.Config().ConnConfig
			var db, user string
			if err := pool.QueryRow(ctx, `SELECT current_database(), current_user`).Scan(&db, &user); err == nil {
				fmt.Fprintf(out, "using the local PostgreSQL at %s:%d (database %s, user %s)\n", cfg.Host, cfg.Port, db, user)
				return pool, pool.Close, nil
			}
			pool.Close()
		}
	}
	fmt.Fprintln(out, "no PostgreSQL answered; starting a throwaway one from the local server binaries...")
	return startThrowaway(ctx, out)
}

func startThrowaway(ctx context.Context, out io.Writer) (*pgxpool.Pool, func(), error) {
	srv, err := pgserver.Start(ctx)
	if err != nil {
		if errors.Is(err, pgserver.ErrNoBinaries) {
			return nil, nil, fmt.Errorf("no database: set PROJECTOR_DATABASE_URL, start PostgreSQL, or install its server package (Debian: apt-get install postgresql): %w", err)
		}
		return nil, nil, err
	}
	fmt.Fprintf(out, "throwaway PostgreSQL running in %s (removed on exit)\n", srv.Dir())
	pool, err := cli.Connect(ctx, srv.URL)
	if err != nil {
		_ = srv.Stop()
		return nil, nil, err
	}
	return pool, func() {
		pool.Close()
		if err := srv.Stop(); err != nil {
			fmt.Fprintln(out, "stopping the throwaway PostgreSQL:", err)
		}
	}, nil
}
