package cli

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/jetstream"
	"github.com/projectorhq/projector/stores/postgres"
)

// ErrNoConsumerHandler: `relay dead-letters retry` ran in a binary that
// wires no JetStream consumer of the subscription (cli.Config
// .JetStreamConsumers), so there is no handler to run the dead letter again.
var ErrNoConsumerHandler = errors.New("no JetStream consumer of this subscription is wired into this binary (cli.Config.JetStreamConsumers): retry from the consumer service's own binary")

// relayDeadLettersCmd is `relay dead-letters`: the messages a JetStream
// claims consumer gave up on, in the consumer's database.
func (a *App) relayDeadLettersCmd() *cobra.Command {
	cmd := group("dead-letters", "List, show, retry and discard the messages a JetStream claims consumer dead-lettered")
	cmd.Long = `The claims consumer (stores/jetstream) writes a message whose handler failed MaxDeliver
times, or that could not be decoded, to projector_jetstream_dead_letters in its own
database; point --database-url and --schema there. A dead letter is open until a retry
applies it (resolved) or an operator discards it (discarded); neither deletes it, so the
table stays the record of what failed and what was done about it. list, show and discard
work from any binary; retry runs the consumer's handler, so it works only in a binary
that wires its consumers (cli.Config.JetStreamConsumers). See docs/jetstream.md.`
	cmd.AddCommand(a.relayDLListCmd(), a.relayDLShowCmd(), a.relayDLRetryCmd(), a.relayDLDiscardCmd())
	return cmd
}

func (a *App) relayDLListCmd() *cobra.Command {
	var subscription, status string
	var limit int
	var after int64
	cmd := listCmd{
		use:   "list --subscription S [--status open|resolved|discarded|all] [--limit N] [--after ID]",
		short: "List a subscription's dead letters (open ones unless --status says otherwise), oldest first",
		long: `List a subscription's dead letters, oldest first: the open ones, or those of --status
(resolved, discarded, or all). Pages of --limit rows: pass the last id shown as --after
for the next page.`,
		limit: &limit, after: &after, status: &status, subscription: &subscription,
		run: func(cmd *cobra.Command, asJSON bool) error {
			return a.withStore(cmd, func(store *postgres.Store) error {
				dls, err := jetstream.ListDeadLettersMatching(cmd.Context(), store,
					jetstream.DeadLetterFilter{Subscription: subscription, Status: status, AfterID: after, Limit: limit})
				if err != nil {
					return err
				}
				if asJSON {
					out := make([]relayDLJSON, len(dls))
					for i, d := range dls {
						out[i] = relayDLView(d)
					}
					return writeJSON(a.out, out)
				}
				if len(dls) == 0 {
					which := ""
					if status != "" {
						which = status + " "
					}
					past := ""
					if after > 0 {
						past = fmt.Sprintf(" after id %d", after)
					}
					_, err := fmt.Fprintf(a.out, "no %sdead letters for %s%s\n", which, subscription, past)
					return err
				}
				w := tabwriter.NewWriter(a.out, 0, 0, 2, ' ', 0)
				fmt.Fprintln(w, "ID\tEVENT\tTYPE\tSUBJECT\tSTATUS\tDELIVERIES\tAT\tERROR")
				for _, d := range dls {
					fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", d.ID, eventIDText(d), cmpDash(text(d.Header.Get(jetstream.HeaderEventType), cellText)),
						text(d.Subject, cellText), d.Status, d.Deliveries, d.CreatedAt.UTC().Format("2006-01-02T15:04:05Z"), text(d.Error, 80))
				}
				return w.Flush()
			})
		},
	}.command()
	// The relay dead-letter commands' help has always worded these so.
	cmd.Flags().Lookup("limit").Usage = "rows per page (1 to 10000)"
	cmd.Flags().Lookup("output").Usage = "table or json"
	return cmd
}

func (a *App) relayDLShowCmd() *cobra.Command {
	var subscription string
	cmd := showCmd{
		use:   "show ID --subscription S",
		short: "Show a dead letter: status, subject, headers, body, error",
		args:  oneID, parse: parseID, subscription: &subscription,
		run: func(cmd *cobra.Command, id int64, asJSON bool) error {
			return a.withStore(cmd, func(store *postgres.Store) error {
				d, err := jetstream.GetDeadLetter(cmd.Context(), store, subscription, id)
				if err != nil {
					return err
				}
				if asJSON {
					return writeJSON(a.out, relayDLView(d))
				}
				w := a.out
				fmt.Fprintf(w, "dead letter %d of %s\n  status      %s\n", d.ID, d.Subscription, d.Status)
				if d.ResolvedAt != nil {
					fmt.Fprintf(w, "  %-11s %s\n", d.Status, d.ResolvedAt.UTC().Format(time.RFC3339))
				}
				if d.LastRetriedAt != nil {
					fmt.Fprintf(w, "  retried     %s\n", d.LastRetriedAt.UTC().Format(time.RFC3339))
				}
				fmt.Fprintf(w, "  event       %s\n  subject     %s\n  deliveries  %d\n  at          %s\n  error       %s\n  headers\n",
					eventIDText(d), text(d.Subject, lineText), d.Deliveries, d.CreatedAt.UTC().Format("2006-01-02T15:04:05Z"), text(d.Error, lineText))
				for _, k := range slices.Sorted(func(yield func(string) bool) {
					for k := range d.Header {
						if !yield(k) {
							return
						}
					}
				}) {
					fmt.Fprintf(w, "    %s: %s\n", text(k, cellText), text(strings.Join(d.Header.Values(k), ", "), lineText))
				}
				_, err = fmt.Fprintf(w, "  body\n    %s\n", bodyText(d.Data))
				return err
			})
		},
	}.command()
	cmd.Flags().Lookup("output").Usage = "table or json"
	return cmd
}

func (a *App) relayDLRetryCmd() *cobra.Command {
	var subscription string
	var all bool
	cmd := &cobra.Command{
		Use:   "retry ID...|--all --subscription S",
		Short: "Run the consumer's handler again for dead letters (only in a binary that wires its JetStream consumers)",
		Long: `retry runs the subscription's handler for each open dead letter named, or with --all for
every open dead letter of --subscription, in a transaction that also marks it resolved:
the effect and the status commit together, so the event is applied once. A retry whose
handler fails again rolls the handler's writes back, keeps the dead letter open with the
new error and the time of the retry, and is reported as "retried, failed again" (exit 1);
retrying a resolved or discarded one is refused (exit 3). One that cannot be retried does
not stop the others: it is named on a line of its own. Only Ctrl-C, or a failure that is
not about one dead letter (the database, its schema or grants, the connection), stops the
command early, saying how many it tried and left untried; the final error counts the
resolved, failed, untried and unretried ones. It needs the handler, so it works in the
consumer service's binary, which mounts this command tree with
cli.Config.JetStreamConsumers.`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if all == (len(args) > 0) {
				return usageError{errors.New("name dead-letter ids, or --all for every open one of --subscription")}
			}
			ids, err := parseIDs(args)
			if err != nil {
				return err
			}
			if err := validateSubscription(subscription, false); err != nil {
				return err
			}
			if a.cfg.JetStreamConsumers == nil {
				return noConsumerHandler(subscription)
			}
			return a.withStore(cmd, func(store *postgres.Store) error {
				c, err := a.wiredConsumer(store, subscription)
				if err != nil {
					return err
				}
				if all {
					if ids, err = openRelayDeadLetterIDs(cmd, store, subscription); err != nil {
						return err
					}
					if len(ids) == 0 {
						_, err := fmt.Fprintf(a.out, "no open dead letters of %s to retry\n", subscription)
						return err
					}
				}
				retry := a.relayDeadLetterRetrier(cmd.Context(), c)
				if !all && len(ids) == 1 {
					again, err := retry(ids[0])
					if err != nil && !again {
						fmt.Fprintf(a.out, "dead letter %d: not retried: %s\n", ids[0], text(message(err), lineText))
					}
					return err
				}
				return retryEach(cmd.Context(), a.out, "dead letter", ids, retry)
			})
		},
	}
	cmd.Flags().StringVar(&subscription, "subscription", "", "the consumer's subscription (required)")
	cmd.Flags().BoolVar(&all, "all", false, "retry every open dead letter of --subscription")
	return cmd
}

// wiredConsumer returns the JetStream consumer of subscription this binary
// wires (cli.Config.JetStreamConsumers), built on store, to retry with its
// handler; [ErrNoConsumerHandler], a usage error, when it wires none.
func (a *App) wiredConsumer(store *postgres.Store, subscription string) (*jetstream.Consumer, error) {
	if a.cfg.JetStreamConsumers == nil {
		return nil, noConsumerHandler(subscription)
	}
	consumers, err := a.cfg.JetStreamConsumers(store)
	if err != nil {
		return nil, fmt.Errorf("build the JetStream consumers: %w", err)
	}
	i := slices.IndexFunc(consumers, func(c *jetstream.Consumer) bool { return c.Subscription() == subscription })
	if i < 0 {
		return nil, noConsumerHandler(subscription)
	}
	return consumers[i], nil
}

// noConsumerHandler is the usage error of a retry this binary has no
// handler for: checked before connecting, when it wires no consumer at all.
func noConsumerHandler(subscription string) error {
	return usageError{fmt.Errorf("retry %s: %w", subscription, ErrNoConsumerHandler)}
}

// openRelayDeadLetterIDs pages through every open dead letter of
// subscription, taken before any is retried: one that fails again stays
// open and is not tried twice.
func openRelayDeadLetterIDs(cmd *cobra.Command, store *postgres.Store, subscription string) ([]int64, error) {
	f := jetstream.DeadLetterFilter{Subscription: subscription, Status: projection.DeadLetterOpen, Limit: 1000}
	return pagedIDs(f.Limit, func(after int64) ([]jetstream.DeadLetter, error) {
		f.AfterID = after
		return jetstream.ListDeadLettersMatching(cmd.Context(), store, f)
	}, func(d jetstream.DeadLetter) int64 { return d.ID })
}

func (a *App) relayDLDiscardCmd() *cobra.Command {
	var subscription string
	cmd := &cobra.Command{
		Use:   "discard ID... --subscription S",
		Short: "Mark dead letters discarded without running their handler (their effects are given up, the record kept)",
		Long: `discard marks open dead letters discarded without applying them: the operator's decision
that their effects are not wanted; the rows stay as the record. The events stay claimed
and their streams past them, so they are never applied later either. Discarding one that
is resolved or discarded already is refused (exit 3). A dead letter being retried at the
same moment is either retried or discarded, never both (the loser is refused: it is not
open any more). Of several ids, one that cannot be discarded does not stop the others;
Ctrl-C, or a failure that is not about one dead letter (the database, its schema or
grants), stops the command with a line saying how many it left.`,
		Args: someIDs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ids, err := parseIDs(args)
			if err != nil {
				return err
			}
			if err := validateSubscription(subscription, false); err != nil {
				return err
			}
			return a.withStore(cmd, func(store *postgres.Store) error {
				return a.eachDeadLetter(cmd.Context(), ids, "discarded", "discarded (kept for the record)", func(id int64) error {
					return jetstream.DiscardDeadLetter(cmd.Context(), store, subscription, id)
				})
			})
		},
	}
	cmd.Flags().StringVar(&subscription, "subscription", "", "the consumer's subscription (required)")
	return cmd
}

// relayDeadLetterRetrier returns the retry of one dead letter through c's
// handler that retryEach runs: it prints "dead letter N: applied and
// resolved" or "dead letter N: retried, the handler failed again; still
// open: <error>" and returns again true (with the *RetryFailedError) for
// the latter, or the error that kept the retry from running.
func (a *App) relayDeadLetterRetrier(ctx context.Context, c *jetstream.Consumer) func(id int64) (bool, error) {
	return func(id int64) (bool, error) {
		err := c.RetryDeadLetter(ctx, id)
		var again *jetstream.RetryFailedError
		switch {
		case err == nil:
			fmt.Fprintf(a.out, "dead letter %d: applied and resolved\n", id)
			return false, nil
		case errors.As(err, &again):
			fmt.Fprintf(a.out, "dead letter %d: retried, the handler failed again; still open: %s\n", id, text(again.Err.Error(), 500))
			return true, err
		}
		return false, err
	}
}

// eachDeadLetter runs do for every id, printing "dead letter N: <done>" or
// "dead letter N: not <verb>: <error>" for each, and returns every
// failure: one dead letter that cannot be handled does not stop the others.
// Ctrl-C (ctx done) between two ids, or a failure that is not about one
// dead letter (stopsAll: the database, its schema or grants), stops it,
// with a line saying how many it left undone; the error then holds the
// cause too.
func (a *App) eachDeadLetter(ctx context.Context, ids []int64, verb, done string, do func(int64) error) error {
	var errs deadLetterErrors
	stop := func(next int, why string) {
		if left := len(ids) - next; left > 0 {
			fmt.Fprintf(a.out, "%s: %d of %d dead letters tried, %d left not %s\n", why, next, len(ids), left, verb)
		}
	}
	for i, id := range ids {
		if err := ctx.Err(); err != nil {
			stop(i, "interrupted")
			errs = append(errs, fmt.Errorf("interrupted before dead letter %d: %w", id, err))
			break
		}
		err := do(id)
		if err == nil {
			fmt.Fprintf(a.out, "dead letter %d: %s\n", id, done)
			continue
		}
		fmt.Fprintf(a.out, "dead letter %d: not %s: %s\n", id, verb, text(err.Error(), 500))
		errs = append(errs, err)
		if ctx.Err() != nil {
			stop(i+1, "interrupted")
			break
		}
		if stopsAll(err) {
			stop(i+1, fmt.Sprintf("stopped at the failure of dead letter %d, which is not about one dead letter", id))
			break
		}
	}
	if len(errs) == 0 {
		return nil
	}
	return errs
}

// deadLetterErrors are the failures of one command over several dead
// letters: each is still there for errors.Is and errors.As (the exit
// code), and the message separates them, where errors.Join's newline
// would run them together on the one line the CLI prints.
type deadLetterErrors []error

func (e deadLetterErrors) Error() string {
	msgs := make([]string, len(e))
	for i, err := range e {
		msgs[i] = err.Error()
	}
	if len(e) == 1 {
		return msgs[0]
	}
	return fmt.Sprintf("%d dead letters failed: %s", len(e), strings.Join(msgs, "; "))
}

func (e deadLetterErrors) Unwrap() []error { return e }

// oneID accepts exactly one argument, with the usage exit code.
func oneID(_ *cobra.Command, args []string) error {
	if len(args) != 1 {
		return usageError{fmt.Errorf("want one dead-letter id, got %d arguments", len(args))}
	}
	return nil
}

// relayDLJSON is a JetStream dead letter as `-o json` prints it.
type relayDLJSON struct {
	ID           int64               `json:"id"`
	Subscription string              `json:"subscription"`
	EventID      string              `json:"event_id,omitempty"`
	Subject      string              `json:"subject"`
	Headers      map[string][]string `json:"headers"`
	Body         string              `json:"body"`
	Error        string              `json:"error"`
	Deliveries   int64               `json:"deliveries"`
	CreatedAt    string              `json:"created_at"`
	Status       string              `json:"status"`
	// ResolvedAt is when it was resolved or discarded.
	ResolvedAt    *time.Time `json:"resolved_at,omitempty"`
	LastRetriedAt *time.Time `json:"last_retried_at,omitempty"`
}

func relayDLView(d jetstream.DeadLetter) relayDLJSON {
	out := relayDLJSON{ID: d.ID, Subscription: d.Subscription, Subject: d.Subject, Headers: d.Header,
		Body: bodyText(d.Data), Error: d.Error, Deliveries: d.Deliveries, CreatedAt: d.CreatedAt.UTC().Format("2006-01-02T15:04:05.999999Z07:00"),
		Status: d.Status, ResolvedAt: utcTime(d.ResolvedAt), LastRetriedAt: utcTime(d.LastRetriedAt)}
	if d.EventID != [16]byte{} {
		out.EventID = d.EventID.String()
	}
	if out.Headers == nil {
		out.Headers = map[string][]string{}
	}
	return out
}

// utcTime is t in UTC, like the other times -o json prints; nil stays nil.
func utcTime(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}

// eventIDText is the dead letter's event id, or why there is none.
func eventIDText(d jetstream.DeadLetter) string {
	if d.EventID == [16]byte{} {
		return "(undecodable)"
	}
	return d.EventID.String()
}

// bodyText shows a body as text when it is UTF-8, else says its size.
func bodyText(b []byte) string {
	if utf8.Valid(b) {
		return projector.Printable(string(b))
	}
	return fmt.Sprintf("(%d bytes, not UTF-8)", len(b))
}

func cmpDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
