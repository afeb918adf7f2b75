// Command projector is Projector's ops CLI and daemon. It knows the example
// helpdesk application's event types, so it can show the demo's events, but
// it wires the example's projections (its tables, consumers, ticket search on
// PostgreSQL full-text search and the SLA saga among them, and retention
// defaults) only when asked: with PROJECTOR_EXAMPLE=1, or through `projector
// demo`, which works in a schema of its own. Pointed at any other schema, the
// stock binary adopts nothing. Applications with their own event types and
// projections build the same commands into their own binary with the cli
// package.
package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/cli"
	"github.com/projectorhq/projector/examples/helpdesk"
	"github.com/projectorhq/projector/saga"
	"github.com/projectorhq/projector/stores/pgsearch"
	"github.com/projectorhq/projector/stores/postgres"
)

// EnvExample names the variable that wires the example application into
// every command (`run` dispatches its projections, `events prune` deletes its
// ephemeral streams by default). Unset, the stock binary creates no example
// tables and registers no example consumers in the schema it is pointed at:
// a consumer, once registered, holds retention back for good.
const EnvExample = "PROJECTOR_EXAMPLE"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Getenv, nil, nil)
	stop()
	os.Exit(code)
}

// run is the binary on args, with getenv for its environment and stdout and
// stderr for its output (nil: the process's own), returning the exit code:
// the tests run most command lines through it in their own process, where
// starting a -race binary per call would cost the suite its CPU.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	errOut := cmp.Or[io.Writer](stderr, os.Stderr)
	types, err := helpdesk.Define(projector.NewRegistry())
	if err != nil {
		fmt.Fprintln(errOut, "projector:", err)
		return cli.ExitError
	}
	if _, err := helpdesk.DefineSLA(types.Registry); err != nil {
		fmt.Fprintln(errOut, "projector:", err)
		return cli.ExitError
	}
	return cli.Run(ctx, cli.Config{
		Registry: types.Registry,
		Getenv:   getenv,
		Wire: func(schema string) (cli.Wiring, error) {
			want, err := exampleWanted(getenv)
			if err != nil || !want {
				return cli.Wiring{}, err
			}
			// Welcome mails go to standard output: the example's stand-in
			// for a mail service.
			app, err := helpdesk.NewApp(types, schema, cmp.Or[io.Writer](stdout, os.Stdout))
			if err != nil {
				return cli.Wiring{}, err
			}
			// Ticket search on PostgreSQL full-text search: its table is
			// made in Setup, its writes go through the dispatcher's
			// transaction, and `search verify` binds it to the pool.
			backend, err := pgsearch.NewForSchema(schema, pgsearch.Config{})
			if err != nil {
				return cli.Wiring{}, err
			}
			tickets, err := helpdesk.NewTicketSearch(types, helpdesk.TicketSearch, backend)
			if err != nil {
				return cli.Wiring{}, err
			}
			ticketsAsync, err := tickets.Async()
			if err != nil {
				return cli.Wiring{}, err
			}
			setup := func(ctx context.Context, db postgres.DBTX) error {
				if err := app.Migrate(ctx, db); err != nil {
					return err
				}
				return backend.EnsureOn(ctx, db, helpdesk.TicketIndex)
			}
			return cli.Wiring{Inline: app.Inline(), Async: append(app.Async(), ticketsAsync), Ephemeral: helpdesk.Ephemeral, Setup: setup,
				Sagas: func(store *postgres.Store) ([]saga.Definition, error) {
					// The SLA process manager, on the real clock: its
					// reminders and escalations fire under `run`.
					repo, err := helpdesk.NewTickets(store, types)
					if err != nil {
						return nil, err
					}
					sla, err := helpdesk.NewSLA(types, repo, nil)
					if err != nil {
						return nil, err
					}
					return []saga.Definition{sla}, nil
				}}, nil
		},
		Commands: []*cobra.Command{demoCmd(getenv)},
	}, args, stdout, stderr)
}

// exampleWanted reports whether PROJECTOR_EXAMPLE asks for the example
// application. Unset is no; a value that is not a boolean is an error rather
// than a guess either way.
func exampleWanted(getenv func(string) string) (bool, error) {
	v := getenv(EnvExample)
	if v == "" {
		return false, nil
	}
	want, err := strconv.ParseBool(v)
	if err != nil {
		return false, fmt.Errorf("%s=%q: want 1 (wire the example application) or 0", EnvExample, v)
	}
	return want, nil
}
