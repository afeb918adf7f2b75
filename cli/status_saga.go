package cli

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/saga"
	"github.com/projectorhq/projector/stores/postgres"
)

// writeFailedSagas ends the `status` table with the sagas that have failed
// instances (a timeout that kept failing, or a continuous-mode step that
// was dead-lettered), each with the command that lists them. The JSON
// output stays the list of shards; `saga list NAME --status failed -o json`
// is the scripts' view.
func (a *App) writeFailedSagas(ctx context.Context, store *postgres.Store, asJSON bool) error {
	if asJSON {
		return nil
	}
	counts, err := saga.FailedCounts(ctx, store)
	if err != nil || len(counts) == 0 {
		return err
	}
	if _, err := fmt.Fprintln(a.out, "\nSAGAS WITH FAILED INSTANCES"); err != nil {
		return err
	}
	return writeTable(a.out, func(tw io.Writer) {
		fmt.Fprintln(tw, "SAGA\tFAILED\tSEE")
		for _, name := range slices.Sorted(maps.Keys(counts)) {
			fmt.Fprintf(tw, "%s\t%d\t%s saga list %s --status failed\n", projector.Printable(name), counts[name], a.cfg.Name, projector.Printable(name))
		}
	})
}
