// Command projector is Projector's ops CLI and daemon with the example
// helpdesk application compiled in. Applications with their own event types
// and projections build the same commands into their own binary with the
// cli package.
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/cli"
	"github.com/projectorhq/projector/examples/helpdesk"
)

func main() {
	types, err := helpdesk.Define(projector.NewRegistry())
	if err != nil {
		fmt.Fprintln(os.Stderr, "projector:", err)
		os.Exit(cli.ExitError)
	}
	os.Exit(cli.Main(cli.Config{
		Registry: types.Registry,
		Wire: func(schema string) (cli.Wiring, error) {
			// Welcome mails go to standard output: the example's stand-in
			// for a mail service.
			app, err := helpdesk.NewApp(types, schema, os.Stdout)
			if err != nil {
				return cli.Wiring{}, err
			}
			return cli.Wiring{Inline: app.Inline(), Async: app.Async(), Ephemeral: helpdesk.Ephemeral, Setup: app.Migrate}, nil
		},
		Commands: []*cobra.Command{demoCmd()},
	}))
}
