package cli

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/rebuild"
	"github.com/projectorhq/projector/stores/postgres"
)

// partialFlags are the flags of `rebuild NAME` that narrow it to one
// tenant or one stream: a partial rebuild (docs/rebuilds.md).
type partialFlags struct {
	tenant, streamType, streamID string
	batch                        int
}

// addPartialFlags mounts the partial-rebuild flags on the rebuild command.
// They live here, apart from the whole-rebuild flags, so the two kinds grow
// independently.
func (a *App) addPartialFlags(cmd *cobra.Command) *partialFlags {
	f := &partialFlags{}
	cmd.Flags().StringVar(&f.tenant, "tenant", "", "with --here: rebuild only what this tenant contributed (a partial rebuild)")
	cmd.Flags().StringVar(&f.streamType, "stream-type", "", "with --here and --stream-id: rebuild only what this stream contributed (its tenant: --tenant, default the system tenant)")
	cmd.Flags().StringVar(&f.streamID, "stream-id", "", "partial rebuild: the stream's id (with --stream-type)")
	cmd.Flags().IntVar(&f.batch, "partial-batch", 0, "partial rebuild: events read and applied at a time (default the projection's batch size; 1..100000)")
	return f
}

// set reports whether the command line asks for a partial rebuild.
func (f *partialFlags) set(cmd *cobra.Command) bool {
	for _, name := range []string{"tenant", "stream-type", "stream-id", "partial-batch"} {
		if cmd.Flags().Changed(name) {
			return true
		}
	}
	return false
}

// runPartial rebuilds one scope of the projection name in this process
// (--here), which must have the projection's code (Config.Wire): a partial
// rebuild runs its handlers over the scope's events in one transaction, at
// once, rather than leaving a request to the dispatchers.
func (a *App) runPartial(cmd *cobra.Command, name string, f *partialFlags) error {
	for _, other := range []string{"in-place", "hold", "version", "wait", "pickup-timeout", "diff", "limit"} {
		if cmd.Flags().Changed(other) {
			return usageError{fmt.Errorf("--%s does not apply to a partial rebuild (--tenant, --stream-type/--stream-id): it rebuilds the scope of the live version at once, here", other)}
		}
	}
	if here, _ := cmd.Flags().GetBool("here"); !here {
		// Said explicitly, so that a partial rebuild never reads as a
		// request some dispatcher elsewhere carries out.
		return usageError{fmt.Errorf("a partial rebuild runs the projection's handlers in this process: add --here, in your application's binary (cli.Config.Wire)")}
	}
	if f.batch < 0 || f.batch > 100_000 {
		return usageError{fmt.Errorf("--partial-batch %d: want 1 to 100000 (0: the projection's batch size)", f.batch)}
	}
	scope := projection.Scope{Tenant: f.tenant, StreamType: f.streamType, StreamID: f.streamID}
	switch {
	case (f.streamType == "") != (f.streamID == ""):
		return usageError{errors.New("--stream-type and --stream-id go together: a stream is named by both")}
	case f.tenant == "" && f.streamType == "":
		return usageError{errors.New("a partial rebuild needs --tenant, or --stream-type and --stream-id")}
	case f.tenant == "":
		scope.Tenant = projector.SystemTenant
	}
	if err := scope.Validate(); err != nil {
		return usageError{err}
	}
	w, err := a.wiring()
	if err != nil {
		return err
	}
	var p *projection.Async
	var have []string
	for _, candidate := range w.Async {
		have = append(have, candidate.Name())
		if candidate.Name() == name {
			p = candidate
		}
	}
	if p == nil {
		if len(have) == 0 {
			have = []string{"none"}
		}
		return usageError{fmt.Errorf("a partial rebuild runs the projection's handlers, and this binary has no async projection %s (it has: %s): "+
			"run it with your application's binary (cli.Config.Wire), or rebuild the whole projection with `%s rebuild %s`",
			projector.Printable(name), strings.Join(have, ", "), cmd.Root().Name(), projector.Printable(name))}
	}
	return a.withStore(cmd, func(store *postgres.Store) error {
		res, err := rebuild.Partial(cmd.Context(), store, p, scope, rebuild.PartialOptions{BatchSize: f.batch, Logger: a.logger()})
		if err != nil {
			return rebuildError(err)
		}
		if len(res.Partitions) > 0 {
			// Each stream up to its own partition's cursor.
			fmt.Fprintf(a.out, "partial rebuild of %s, %s: %d events replayed, each stream up to its partition's cursor (%d partitions, the latest at %s)",
				res.Name, res.Scope, res.Events, len(res.Partitions), res.Until)
			if res.LeftToLive > 0 {
				fmt.Fprintf(a.out, ", %d events after their partition's cursor left to it", res.LeftToLive)
			}
		} else {
			fmt.Fprintf(a.out, "partial rebuild of %s, %s: %d events replayed up to %s", res.Name, res.Scope, res.Events, res.Until)
		}
		if res.DeadLettered > 0 {
			fmt.Fprintf(a.out, ", %d dead-lettered", res.DeadLettered)
		}
		if res.ResolvedDeadLetters > 0 {
			fmt.Fprintf(a.out, ", %d open dead letters applied and resolved", res.ResolvedDeadLetters)
		}
		fmt.Fprintf(a.out, "; the live consumer was held %v\n", res.Held.Round(time.Millisecond))
		return nil
	})
}
