package cli

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/stores/postgres"
)

// subjectsCmd is `subjects`: the data subjects of personal fields
// (docs/privacy.md).
func (a *App) subjectsCmd() *cobra.Command {
	cmd := group("subjects", "Data subjects of personal fields: forget one (crypto-shredding)")
	cmd.AddCommand(a.subjectsForgetCmd())
	return cmd
}

func (a *App) subjectsForgetCmd() *cobra.Command {
	var tenant string
	cmd := &cobra.Command{
		Use:   "forget ID",
		Short: "Destroy a data subject's key and append subject.forgotten, in one transaction",
		Long: `Forget a data subject: destroy its key and append a subject.forgotten event to the
stream projector.subject/ID of its tenant, in one transaction. From the commit on, every
read of its events finds its personal fields null, and projections that handle
subject.forgotten delete or blank its rows and documents as they reach the event. Copies
of the wrapped key in WAL archives, replicas and base backups last until those age out
(docs/privacy.md). A subject without a key is an error (exit 1), one already forgotten
is refused (exit 3); nothing is written either way. No master key is needed.`,
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ref := postgres.SubjectRef{Tenant: tenant, ID: args[0]}
			if err := ref.Validate(); err != nil {
				return usageError{err}
			}
			return a.withStore(cmd, func(store *postgres.Store) error {
				res, err := store.Forget(cmd.Context(), ref)
				if err != nil {
					return err
				}
				_, err = fmt.Fprintf(a.out, "forgot subject %s at %s (event %s at %s)\n",
					res.Subject, res.At.UTC().Format(time.RFC3339), res.Event.ID, res.Event.Position)
				return err
			})
		},
	}
	cmd.Flags().StringVar(&tenant, "tenant", projector.SystemTenant, "the subject's tenant")
	return cmd
}
