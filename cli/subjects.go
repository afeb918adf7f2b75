package cli

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/stores/postgres"
)

// subjectsCmd is `subjects`: the data subjects of personal fields
// (docs/privacy.md).
func (a *App) subjectsCmd() *cobra.Command {
	cmd := group("subjects", "Data subjects of personal fields: forget one (crypto-shredding), rewrap their keys")
	cmd.AddCommand(a.subjectsForgetCmd(), a.subjectsRewrapCmd())
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
			// The forgotten event goes to the stream projector.subject/ID of
			// the tenant: a subject whose stream cannot exist (a name over
			// the limit) cannot be forgotten, whatever the database holds.
			if err := projector.TenantStream(tenant, projector.SubjectStreamType, args[0]).Validate(); err != nil {
				return usageError{fmt.Errorf("subject %s: %w", ref, err)}
			}
			if !a.cfg.Registry.HasPersonal() {
				// The stock binary on an application's schema: the forgotten
				// event and the personal types are the application's.
				return fmt.Errorf("forget subject %s: this binary's registry defines no event type with personal fields (%w); "+
					"run the command from your application's binary (package cli, with your event types in cli.Config.Registry; docs/operations.md)",
					ref, projector.ErrUnknownEventType)
			}
			return a.withStore(cmd, func(store *postgres.Store) error {
				res, err := store.Forget(cmd.Context(), ref)
				if errors.Is(err, projector.ErrNotFound) {
					// Subjects are per tenant: the likeliest slip is the tenant.
					return fmt.Errorf("%w; check the id, and the tenant: a subject is its tenant's (--tenant, here %s)", err, projector.Printable(tenant))
				}
				if err != nil {
					return err
				}
				_, err = fmt.Fprintf(a.out, "forgot subject %s at %s (event %s at %s)\n"+
					"every read now finds its personal fields null; read models that copied them forget them when their consumers reach that event, "+
					"if they handle subject.forgotten (projection.OnForgotten; `%s status` shows the lag; docs/privacy.md)\n",
					res.Subject, res.At.UTC().Format(time.RFC3339), res.Event.ID, res.Event.Position, cmd.Root().Name())
				return err
			})
		},
	}
	cmd.Flags().StringVar(&tenant, "tenant", projector.SystemTenant, "the subject's tenant")
	return cmd
}

func (a *App) subjectsRewrapCmd() *cobra.Command {
	var batch int
	cmd := &cobra.Command{
		Use:   "rewrap",
		Short: "Rewrap every data key under the master key (the last step of a master-key rotation)",
		Long: `Rewrap the data subjects' keys wrapped by an old master key under the master key:
the last step of rotating it (docs/privacy.md, "Rotating the master key").

` + postgres.MasterKeyEnv + ` is the new master key, ` + postgres.OldMasterKeysEnv + ` the old ones
(ID:KEY,ID:KEY). Give every process both before running this: a process with only the
old key cannot open keys this rewraps, and one with only the new key cannot open those
it has not reached yet. Keys are rewrapped in batches of --batch-size, one transaction
each, while appends, reads and forgets go on; a subject forgotten meanwhile stays
forgotten. Interrupted, it keeps the batches it committed: run it again to go on.
Nothing to rewrap is a no-op that says so.

Before changing anything it checks that every key's master key is the master key or an
old one and that each old key opens its keys: otherwise it fails (exit 1) and nothing
changed. A malformed key, or no master key, is a bad command line (exit 2). When keys
wrapped by an old master key remain at the end (made meanwhile by a process still
running with the old key as its master key), it says so and exits 1: restart that
process with the new key and run it again. Then remove the old key everywhere.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if batch < 1 || batch > postgres.MaxRewrapBatch {
				return usageError{fmt.Errorf("--batch-size %d: want 1 to %d", batch, postgres.MaxRewrapBatch)}
			}
			return a.withStore(cmd, func(store *postgres.Store) error {
				return a.rewrap(cmd, store, batch)
			})
		},
	}
	cmd.Flags().IntVar(&batch, "batch-size", postgres.DefaultRewrapBatch, "keys rewrapped per transaction (1 to 10000)")
	return cmd
}

func (a *App) rewrap(cmd *cobra.Command, store *postgres.Store, batch int) error {
	var last time.Time
	res, err := store.RewrapKeys(cmd.Context(), postgres.RewrapOptions{BatchSize: batch, Progress: func(r postgres.RewrapResult) {
		if time.Since(last) >= 2*time.Second {
			last = time.Now()
			fmt.Fprintf(a.out, "rewrapped %d of %d keys (%d batches)\n", r.Rewrapped, total(r.Pending), r.Batches)
		}
	}})
	switch {
	case errors.Is(err, postgres.ErrNoMasterKey):
		return usageError{fmt.Errorf("%w: set %s to the new master key and %s to the old ones", err, postgres.MasterKeyEnv, postgres.OldMasterKeysEnv)}
	case err != nil && res.Rewrapped > 0:
		return fmt.Errorf("%w (%d keys were rewrapped and stay so; run the command again to go on)", err, res.Rewrapped)
	case err != nil:
		return err
	case len(res.Pending) == 0:
		_, err = fmt.Fprintf(a.out, "nothing to rewrap: every data key is wrapped by master key %s\n", res.MasterKeyID)
		return err
	}
	var from []string
	for _, id := range slices.Sorted(maps.Keys(res.Pending)) {
		from = append(from, fmt.Sprintf("%s: %d", id, res.Pending[id]))
	}
	if _, err := fmt.Fprintf(a.out, "rewrapped %d data keys under master key %s in %d batches (from %s)\n",
		res.Rewrapped, res.MasterKeyID, res.Batches, strings.Join(from, ", ")); err != nil {
		return err
	}
	if res.Forgotten > 0 {
		if _, err := fmt.Fprintf(a.out, "%d subjects were forgotten meanwhile and stay forgotten\n", res.Forgotten); err != nil {
			return err
		}
	}
	if res.Remaining > 0 {
		return fmt.Errorf("%d data keys are still wrapped by an old master key: a process is still running with it as %s; restart it with the new key and run rewrap again",
			res.Remaining, postgres.MasterKeyEnv)
	}
	return nil
}

func total(m map[string]int64) int64 {
	var n int64
	for _, v := range m {
		n += v
	}
	return n
}
