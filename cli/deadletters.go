package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

// deadLettersCmd is `dead-letters`: what continuous-mode consumers could not
// apply, and the operator's ways out of it (docs/operations.md, the
// dead-letter runbook).
func (a *App) deadLettersCmd() *cobra.Command {
	cmd := group("dead-letters", "List, show, retry and discard the events continuous-mode consumers could not apply")
	cmd.AddCommand(a.deadLettersListCmd(), a.deadLettersShowCmd(), a.deadLettersRetryCmd(), a.deadLettersDiscardCmd())
	return cmd
}

func (a *App) deadLettersListCmd() *cobra.Command {
	var f projection.DeadLetterFilter
	var since string
	cmd := listCmd{
		use:   "list",
		short: "List dead letters (open ones unless --status says otherwise), oldest first",
		long: `List dead letters, oldest first, filtered by any combination of --consumer,
--instance, --type, --tenant, --reason, --status (open by default; "all" for every one)
and --since (an age such as 24h or 7d, or an RFC 3339 time). Pages of --limit rows:
pass the last id shown as --after for the next page. --model superseded keeps the
dead letters of a model a rebuild replaced (or of a cancelled rebuild), which can
only be discarded; --model live those a retry may apply.`,
		limit: &f.Limit, after: &f.AfterID, status: &f.Status,
		run: func(cmd *cobra.Command, asJSON bool) error {
			switch f.Reason {
			case "", "apply-error", "skipped":
			default:
				return usageError{fmt.Errorf("--reason %q: want apply-error or skipped", f.Reason)}
			}
			switch f.Model {
			case "", projection.ModelLive, projection.ModelSuperseded:
			default:
				return usageError{fmt.Errorf("--model %q: want live or superseded", f.Model)}
			}
			if since != "" {
				var err error
				if f.Since, err = parseSince(since); err != nil {
					return usageError{fmt.Errorf("--since: %w", err)}
				}
			}
			if err := textFlags(cmd, "consumer", "instance", "type", "tenant"); err != nil {
				return err
			}
			return a.withStore(cmd, func(store *postgres.Store) error {
				dls, err := projection.ListDeadLetters(cmd.Context(), store, f)
				if errors.Is(err, projection.ErrInvalidFilter) {
					return usageError{err}
				}
				if err != nil {
					return err
				}
				if len(dls) == 0 {
					if err := knownConsumer(cmd.Context(), store, f.Consumer, "projector_dead_letters"); err != nil {
						return err
					}
				}
				return writeList(a.out, asJSON, dls, "no dead letters match", func(tw io.Writer) {
					fmt.Fprintln(tw, "ID\tCONSUMER\tINSTANCE\tEVENT TYPE\tSTREAM\tVERSION\tSTATUS\tATTEMPTS\tRECORDED\tERROR")
					for _, dl := range dls {
						fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%d\t%s\t%d\t%s\t%s\n", dl.ID, projector.Printable(dl.Consumer),
							projector.Printable(dl.Instance), projector.Printable(dl.EventType), deadLetterStream(dl), dl.Version,
							deadLetterStatus(dl), dl.Attempts, dl.CreatedAt.UTC().Format(time.RFC3339), text(dl.Error, 80))
					}
				})
			})
		},
	}.command()
	fl := cmd.Flags()
	fl.StringVar(&f.Consumer, "consumer", "", "only this consumer's")
	fl.StringVar(&f.Instance, "instance", "", "only this instance's (shared shards: "+projection.SharedInstance+")")
	fl.StringVar(&f.EventType, "type", "", "only events of this type")
	fl.StringVar(&f.Tenant, "tenant", "", "only this tenant's events")
	fl.StringVar(&f.Reason, "reason", "", "apply-error or skipped")
	fl.StringVar(&f.Model, "model", "", "live (dead letters a retry may apply) or superseded (of a model a rebuild replaced: discard them)")
	fl.StringVar(&since, "since", "", "recorded within this age (24h, 7d) or at or after this RFC 3339 time")
	return cmd
}

func (a *App) deadLettersShowCmd() *cobra.Command {
	return showCmd{
		use:   "show ID",
		short: "Show a dead letter with its event's envelope and payload (or that the event was pruned)",
		args:  oneID, parse: parseID,
		run: func(cmd *cobra.Command, id int64, asJSON bool) error {
			return a.withStore(cmd, func(store *postgres.Store) error {
				dl, ev, err := projection.GetDeadLetterRaw(cmd.Context(), store, id)
				if err != nil {
					return deadLetterNotFound(cmd, err)
				}
				if asJSON {
					out := struct {
						projection.DeadLetter
						EventPruned bool             `json:"event_pruned"`
						Event       *projector.Event `json:"event,omitempty"`
					}{dl, ev == nil, ev}
					return writeJSON(a.out, out)
				}
				w := a.out
				fmt.Fprintf(w, "dead letter %d: %s\n", dl.ID, deadLetterStatus(dl))
				fmt.Fprintf(w, "consumer:   %s (instance %s)\n", projector.Printable(dl.Consumer), projector.Printable(dl.Instance))
				fmt.Fprintf(w, "event:      %s %s v%d of %s\n", projector.Printable(dl.EventType), dl.EventID, dl.Version, deadLetterStream(dl))
				fmt.Fprintf(w, "reason:     %s, %d attempts, recorded %s\n", projector.Printable(dl.Reason), dl.Attempts, dl.CreatedAt.UTC().Format(time.RFC3339))
				if dl.ModelRebuildID != 0 {
					fmt.Fprintf(w, "model:      the one rebuild %d built (a retry is refused once another rebuild replaces it)\n", dl.ModelRebuildID)
				}
				if dl.LastRetriedAt != nil {
					fmt.Fprintf(w, "retried:    %s\n", dl.LastRetriedAt.UTC().Format(time.RFC3339))
				}
				fmt.Fprintf(w, "error:      %s\n", text(dl.Error, lineText))
				if ev == nil {
					fmt.Fprintln(w, "event pruned: it is no longer in the log, so it cannot be retried; discard the dead letter to close it")
					return nil
				}
				fmt.Fprintf(w, "recorded:   %s, schema version %d\n", ev.RecordedAt.UTC().Format(time.RFC3339), ev.SchemaVersion)
				fmt.Fprintf(w, "metadata:   correlation %s, causation %s, actor %s\n", ev.Metadata.CorrelationID, ev.Metadata.CausationID, projector.Printable(ev.Metadata.Actor))
				if len(ev.Metadata.Headers) > 0 {
					h, _ := json.Marshal(ev.Metadata.Headers)
					fmt.Fprintf(w, "headers:    %s\n", projector.PrintableText(string(h), lineText))
				}
				fmt.Fprintf(w, "payload:    %s\n", projector.PrintableText(string(ev.Data), lineText))
				return nil
			})
		},
	}.command()
}

func (a *App) deadLettersRetryCmd() *cobra.Command {
	var all, here bool
	var consumer string
	cmd := &cobra.Command{
		Use:   "retry ID...|--all --consumer NAME",
		Short: "Apply dead letters' events again through their consumer's handlers",
		Long: `Apply dead letters' events again through their consumer's handlers. A retry that
succeeds commits the handler's writes together with the dead letter marked resolved,
so the event is applied exactly once; retrying a resolved one is refused (exit 3). A
retry that fails keeps the dead letter open with the new error and one more attempt
(exit 1). Events of a stream whose later events the consumer applied already are
applied out of order, and the command says so: that is what continuous mode means.

With several ids or --all --here, a dead letter that cannot be retried (resolved or
discarded meanwhile, a retry aborted by conflicts, a consumer this binary does not
wire) is named on a line of its own and the others are still retried. Only Ctrl-C, or
a failure that is not about one dead letter (the database, its schema or grants, the
connection), stops the command early, saying how many it tried and left untried. The
final error counts the resolved, failed, untried and unretried ones; the exit code is
that of the failures (2 for an unwired consumer, 3 for a refusal, else 1).

The handlers are the projection's code: with --here the retry runs in this process,
which must be your application's binary (cli.Config.Wire); without it the request
is recorded and a running dispatcher that has the projection carries it out (check
with ` + "`dead-letters list --status all`" + `).

A dead letter recorded against a model of the consumer that a rebuild has since
replaced is refused (exit 3): the rebuild replayed its event, so a retry could apply
it twice; discard it. --all retries those of the live model only and says how many
others it left (` + "`dead-letters list --model superseded`" + `).`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if all == (len(args) > 0) {
				return usageError{errors.New("name dead-letter ids, or --all with --consumer")}
			}
			if all && consumer == "" {
				return usageError{errors.New("--all needs --consumer NAME: retries are per consumer")}
			}
			if !all && consumer != "" {
				return usageError{errors.New("--consumer goes with --all")}
			}
			ids, err := parseIDs(args)
			if err != nil {
				return err
			}
			return a.withStore(cmd, func(store *postgres.Store) error {
				ctx := cmd.Context()
				if all {
					if ids, err = openDeadLetterIDs(cmd, store, consumer, projection.ModelLive); err != nil {
						return err
					}
					others, err := openDeadLetterIDs(cmd, store, consumer, projection.ModelSuperseded)
					if err != nil {
						return err
					}
					if len(others) > 0 {
						fmt.Fprintf(a.out, "left %d open dead letters of %s recorded against a model a rebuild replaced: they cannot be retried; "+
							"discard them (dead-letters list --consumer %s --model superseded)\n", len(others), projector.Printable(consumer), projector.Printable(consumer))
					}
					if len(ids) == 0 {
						if len(others) == 0 {
							if err := knownConsumer(ctx, store, consumer, "projector_dead_letters"); err != nil {
								return err
							}
						}
						fmt.Fprintf(a.out, "no open dead letters of %s to retry\n", projector.Printable(consumer))
						return nil
					}
				}
				if !here {
					if err := projection.RequestDeadLetterRetry(ctx, store, ids); err != nil {
						return deadLetterNotFound(cmd, err)
					}
					fmt.Fprintf(a.out, "retry requested for %d dead letters; a running dispatcher with the projection carries it out (or run with --here in your application's binary)\n", len(ids))
					return nil
				}
				r := a.deadLetterRetrier(ctx, store)
				if !all && len(ids) == 1 {
					// One dead letter: its refusal is the command's, as it
					// always was (exit 3, or 2 for an unwired consumer).
					again, err := r(ids[0])
					if again {
						return fmt.Errorf("the retry of dead letter %d failed; it stays open with the new error", ids[0])
					}
					return deadLetterNotFound(cmd, err)
				}
				return retryEach(ctx, a.out, "dead letter", ids, r)
			})
		},
	}
	cmd.Flags().BoolVar(&all, "all", false, "retry every open dead letter of --consumer")
	cmd.Flags().StringVar(&consumer, "consumer", "", "with --all: the consumer")
	cmd.Flags().BoolVar(&here, "here", false, "run the handlers in this process (your application's binary, cli.Config.Wire)")
	return cmd
}

// deadLetterRetrier returns the retry of one dead letter in this process
// (--here) that retryEach runs: it prints the outcome of a retry that ran
// (applied and resolved, or failed again and still open, out of order or
// not) and returns again true for one that failed again, or the error that
// kept it from running. The wired consumers, async projections and sagas
// alike (a saga in continuous mode dead-letters under its consumer), are
// looked up by name once each.
func (a *App) deadLetterRetrier(ctx context.Context, store *postgres.Store) func(id int64) (bool, error) {
	consumers := map[string]*projection.Async{}
	return func(id int64) (bool, error) {
		dl, _, err := projection.GetDeadLetterRaw(ctx, store, id)
		if err != nil {
			return false, err
		}
		p, ok := consumers[dl.Consumer]
		if !ok {
			if p, err = a.consumerByName(store, dl.Consumer); err != nil {
				return false, wiringError{err}
			}
			consumers[dl.Consumer] = p
		}
		if p == nil {
			return false, usageError{fmt.Errorf("dead letter %d belongs to %s, and this binary has no async projection or saga of that name: run it with your application's binary (cli.Config.Wire), or without --here for a running dispatcher",
				id, projector.Printable(dl.Consumer))}
		}
		res, err := projection.RetryDeadLetter(ctx, store, p, id, a.logger())
		if err != nil {
			return false, err
		}
		order := ""
		if res.OutOfOrder {
			order = " (out of order: later events of its stream were applied before it)"
		}
		if !res.Resolved {
			fmt.Fprintf(a.out, "dead letter %d: failed again (attempt %d), still open%s: %s\n", id, res.Attempts, order, text(res.Error, lineText))
			return true, nil
		}
		fmt.Fprintf(a.out, "dead letter %d: applied and resolved%s\n", id, order)
		return false, nil
	}
}

func (a *App) deadLettersDiscardCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "discard ID...",
		Short: "Mark dead letters discarded: given up on, kept for the record",
		Args:  someIDs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ids, err := parseIDs(args)
			if err != nil {
				return err
			}
			return a.withStore(cmd, func(store *postgres.Store) error {
				if err := projection.DiscardDeadLetters(cmd.Context(), store, ids); err != nil {
					return deadLetterNotFound(cmd, err)
				}
				fmt.Fprintf(a.out, "discarded %d dead letters (kept for the record)\n", len(ids))
				return nil
			})
		},
	}
}

// openDeadLetterIDs pages through every open dead letter of consumer.
func openDeadLetterIDs(cmd *cobra.Command, store *postgres.Store, consumer, model string) ([]int64, error) {
	f := projection.DeadLetterFilter{Consumer: consumer, Status: projection.DeadLetterOpen, Limit: 1000, Model: model}
	return pagedIDs(f.Limit, func(after int64) ([]projection.DeadLetter, error) {
		f.AfterID = after
		page, err := projection.ListDeadLetters(cmd.Context(), store, f)
		if errors.Is(err, projection.ErrInvalidFilter) {
			return nil, usageError{fmt.Errorf("--consumer: %w", err)}
		}
		return page, err
	}, func(dl projection.DeadLetter) int64 { return dl.ID })
}

// someIDs accepts one or more dead-letter ids, with the usage exit code;
// parseIDs then checks each.
func someIDs(_ *cobra.Command, args []string) error {
	if len(args) == 0 {
		return usageError{errors.New("want at least one dead-letter id")}
	}
	return nil
}

// parseIDs reads dead-letter ids: positive integers, each once.
func parseIDs(args []string) ([]int64, error) {
	ids := make([]int64, 0, len(args))
	for _, s := range args {
		id, err := parseID(s)
		if err != nil {
			return nil, err
		}
		// An id named twice is acted on once: `discard 5 5` tried the
		// second after the first had closed it, and reported a failure.
		if !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	return ids, nil
}

// parseID reads a dead-letter id: a positive integer.
func parseID(s string) (int64, error) {
	id, err := strconv.ParseInt(s, 10, 64)
	if err != nil || id < 1 {
		return 0, usageError{fmt.Errorf("dead-letter id %s: want a positive integer", quoted(s))}
	}
	return id, nil
}

// statusFlag reads a dead-letter --status flag (open, resolved, discarded
// or all) into a status filter, "" for all: the dispatcher's dead letters
// and the JetStream claims consumer's have the same statuses and the same
// flag.
func statusFlag(s string) (string, error) {
	if s == "all" {
		return "", nil
	}
	if s == "" || projection.ValidateDeadLetterStatus(s) != nil {
		return "", usageError{fmt.Errorf("--status %s: want open, resolved, discarded or all", quoted(s))}
	}
	return s, nil
}

// parseSince reads an age ("24h", "7d") or an RFC 3339 time.
func parseSince(s string) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	d, err := parseAge(s)
	if err != nil {
		return time.Time{}, fmt.Errorf("%q: want an age (24h, 7d) or an RFC 3339 time: %w", s, err)
	}
	return time.Now().Add(-d), nil
}

func deadLetterStream(dl projection.DeadLetter) string {
	return projector.Printable(dl.StreamType) + "/" + projector.Printable(dl.StreamID) + " (tenant " + projector.Printable(dl.Tenant) + ")"
}

func deadLetterStatus(dl projection.DeadLetter) string {
	if dl.RetryRequestedAt != nil && dl.Status == projection.DeadLetterOpen {
		return "open, retry requested"
	}
	return dl.Status
}
