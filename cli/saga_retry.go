package cli

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/saga"
	"github.com/projectorhq/projector/stores/postgres"
)

// sagaRetryCmd is `saga retry NAME KEY`: a failed instance is made active
// again; a parked one has its park retried, as `parked retry` does.
func (a *App) sagaRetryCmd() *cobra.Command {
	var tenant, by string
	var here bool
	cmd := &cobra.Command{
		Use:   "retry NAME KEY",
		Short: "Reactivate a failed saga instance, or retry a parked one's park",
		Long: `Reactivate saga instance KEY of saga NAME.

A parked instance (error mode ParkStream) has its park retried, exactly as
` + "`parked retry`" + ` does: its parked events are applied in order through the saga's
current handlers, in one transaction, and the instance is active again; its timeouts
that fell due while it was parked fire next, once. With --here the handlers run in
this process (your application's binary, cli.Config.Wire); without it a running
dispatcher with the saga carries out the request.

A failed instance (a timeout that kept failing, or continuous mode's dead letter) is
made active again: later events reach it. Its cancelled timeouts are not restored and
the events counted as late since it failed are not replayed; retry its dead letter
(` + "`dead-letters list --consumer NAME`" + `) to take the failed step.

Exactly one of operators racing succeeds; the others, and an instance that is active or
completed, are refused (exit 3).`,
		Args: exactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			name, key := args[0], args[1]
			var err error
			if by, err = operatorName(by, a.getenv); err != nil {
				return err
			}
			return a.withStore(cmd, func(store *postgres.Store) error {
				ctx := cmd.Context()
				in, err := saga.Show(ctx, store, name, tenant, key)
				if errors.Is(err, saga.ErrInvalidArgument) {
					return usageError{err}
				}
				if errors.Is(err, projector.ErrNotFound) {
					return fmt.Errorf("saga %s has no instance %s in tenant %s: %w", projector.Printable(name), quoted(key), quoted(tenant), err)
				}
				if err != nil {
					return err
				}
				switch in.Status {
				case saga.Parked:
					id, err := saga.InstancePark(ctx, store, name, tenant, key)
					if err != nil {
						return err
					}
					return a.retryPark(cmd, store, id, by, here)
				case saga.Failed:
					if _, err := saga.Reactivate(ctx, store, name, tenant, key); err != nil {
						return err
					}
					fmt.Fprintf(a.out, "saga %s instance %s (tenant %s) is active again; its failed step's dead letter, if any, can be retried with `dead-letters retry`\n",
						projector.Printable(name), quoted(key), quoted(tenant))
					return nil
				}
				return fmt.Errorf("saga %s instance %s is %s: only a failed or parked instance can be retried: %w",
					projector.Printable(name), quoted(key), in.Status, projector.ErrInvalidTransition)
			})
		},
	}
	cmd.Flags().StringVar(&tenant, "tenant", projector.SystemTenant, "the instance's tenant")
	cmd.Flags().BoolVar(&here, "here", false, "a parked instance: run the saga's handlers in this process (your application's binary, cli.Config.Wire)")
	cmd.Flags().StringVar(&by, "by", "", "who is retrying, for the park's record (default $USER@host)")
	return cmd
}
