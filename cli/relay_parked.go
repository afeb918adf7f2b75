package cli

import (
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/stores/jetstream"
	"github.com/projectorhq/projector/stores/postgres"
)

// relayParkedCmd is `relay parked`: the streams a JetStream claims consumer
// under ParkStream parked, in the consumer's database.
func (a *App) relayParkedCmd() *cobra.Command {
	cmd := group("parked", "List, show, retry and discard the streams a JetStream claims consumer parked (ErrorMode ParkStream)")
	cmd.Long = `A claims consumer (stores/jetstream) with ErrorMode ParkStream parks a source stream whose
message failed MaxDeliver times: that message and every later one of the stream are stored
in projector_jetstream_parks / projector_jetstream_parked_messages in the consumer's own
database, in order, and never reach the handler until an operator retries or discards the
park; other streams go on. Point --database-url and --schema at the consumer's store.
list, show and discard work from any binary; retry runs the consumer's handler, so it
works only in a binary that wires its consumers (cli.Config.JetStreamConsumers). The
dispatcher's parks (async projections, sagas) are ` + "`parked`" + `'s. See docs/jetstream.md.`
	cmd.AddCommand(a.relayParkedListCmd(), a.relayParkedShowCmd(), a.relayParkedRetryCmd(), a.relayParkedDiscardCmd())
	return cmd
}

func (a *App) relayParkedListCmd() *cobra.Command {
	var f jetstream.ParkFilter
	return listCmd{
		use:   "list --subscription S [--status parked|resolved|discarded|all] [--limit N] [--after ID]",
		short: "List a subscription's parked streams (open parks unless --status says otherwise), oldest first",
		limit: &f.Limit, after: &f.AfterID, status: &f.Status, parks: true, subscription: &f.Subscription,
		run: func(cmd *cobra.Command, asJSON bool) error {
			return a.withStore(cmd, func(store *postgres.Store) error {
				parks, err := jetstream.ListParks(cmd.Context(), store, f)
				if err != nil {
					return err
				}
				return writeList(a.out, asJSON, parks, "no parks of "+f.Subscription+" match", func(tw io.Writer) {
					fmt.Fprintln(tw, "ID\tSTREAM\tFROM\tMESSAGES\tSTATUS\tFAILURES\tPARKED\tERROR")
					for _, p := range parks {
						fmt.Fprintf(tw, "%d\t%s\tv%d\t%d\t%s\t%d\t%s\t%s\n", p.ID, relayParkStream(p), p.Version, p.Messages, p.Status, p.Failures,
							p.ParkedAt.UTC().Format(time.RFC3339), parkErrorCell(p.Status, p.ResolvedBy, p.Error))
					}
				})
			})
		},
	}.command()
}

// relayParkedMessageJSON is a parked message as `-o json` prints it.
type relayParkedMessageJSON struct {
	Version  int64               `json:"version"`
	EventID  string              `json:"event_id"`
	Subject  string              `json:"subject"`
	Headers  map[string][]string `json:"headers"`
	Body     string              `json:"body"`
	ParkedAt time.Time           `json:"parked_at"`
}

func (a *App) relayParkedShowCmd() *cobra.Command {
	var subscription string
	return showCmd{
		use:   "show ID --subscription S",
		short: "Show a park and its parked messages, in the order a retry applies them",
		args:  oneParkID, parse: parseParkID, subscription: &subscription,
		run: func(cmd *cobra.Command, id int64, asJSON bool) error {
			return a.withStore(cmd, func(store *postgres.Store) error {
				p, msgs, err := jetstream.GetPark(cmd.Context(), store, subscription, id)
				if err != nil {
					return err
				}
				if asJSON {
					seq := make([]relayParkedMessageJSON, len(msgs))
					for i, m := range msgs {
						seq[i] = relayParkedMessageJSON{Version: m.Version, EventID: m.EventID.String(), Subject: m.Subject,
							Headers: m.Header, Body: bodyText(m.Data), ParkedAt: m.ParkedAt.UTC()}
						if seq[i].Headers == nil {
							seq[i].Headers = map[string][]string{}
						}
					}
					return writeJSON(a.out, struct {
						jetstream.Park
						Sequence []relayParkedMessageJSON `json:"sequence"`
					}{p, seq})
				}
				w := a.out
				fmt.Fprintf(w, "park %d of %s: %s\n", p.ID, projector.Printable(p.Subscription), p.Status)
				fmt.Fprintf(w, "stream:     %s, parked from v%d (%s %s)\n", relayParkStream(p), p.Version, projector.Printable(p.EventType), p.EventID)
				fmt.Fprintf(w, "parked:     %s after %d handler %s\n", p.ParkedAt.UTC().Format(time.RFC3339), p.Failures, plural(int64(p.Failures), "failure"))
				if p.LastRetriedAt != nil {
					fmt.Fprintf(w, "retried:    %s\n", p.LastRetriedAt.UTC().Format(time.RFC3339))
				}
				writeParkOutcome(w, p.Status, p.ResolvedAt, p.ResolvedBy, p.Messages, "messages", p.Error)
				if len(msgs) > 0 {
					fmt.Fprintf(w, "sequence:   %d messages, applied in this order by a retry\n", len(msgs))
					for _, m := range msgs {
						fmt.Fprintf(w, "  v%d %s %s %s\n", m.Version, cmpDash(text(m.Header.Get(jetstream.HeaderEventType), cellText)), m.EventID, text(bodyText(m.Data), cellText*2))
					}
				}
				return nil
			})
		},
	}.command()
}

func (a *App) relayParkedRetryCmd() *cobra.Command {
	var subscription, by string
	cmd := &cobra.Command{
		Use:   "retry ID --subscription S [--by WHO]",
		Short: "Apply a parked sequence, in order, through the consumer's handler (only in a binary that wires its JetStream consumers)",
		Long: `retry applies a park's whole sequence of messages, in version order, through the
subscription's current handler, in one transaction that also marks the park resolved: each
parked event is applied exactly once, and the stream is live again (a message of it that
arrives meanwhile waits for the retry and is applied after the parked ones). A retry whose
handler fails again applies nothing, keeps the park with the new error (exit 1). Retrying
a park that is resolved or discarded is refused (exit 3). It needs the handler, so it works
in the consumer service's binary, which mounts this command tree with
cli.Config.JetStreamConsumers.`,
		Args: oneParkID,
		RunE: func(cmd *cobra.Command, args []string) error {
			id, by, err := relayParkOp(args[0], subscription, by, a.getenv)
			if err != nil {
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
				n, err := c.RetryPark(cmd.Context(), id, by)
				if err != nil {
					return err
				}
				_, err = fmt.Fprintf(a.out, "park %d: applied its %d messages in order and resolved; the stream is live again\n", id, n)
				return err
			})
		},
	}
	cmd.Flags().StringVar(&subscription, "subscription", "", "the consumer's subscription (required)")
	cmd.Flags().StringVar(&by, "by", "", "who is retrying, for the record (default $USER@host; without $USER the OS user, else the uid)")
	return cmd
}

func (a *App) relayParkedDiscardCmd() *cobra.Command {
	var subscription, by string
	cmd := &cobra.Command{
		Use:   "discard ID --subscription S [--by WHO]",
		Short: "Drop a parked sequence (its messages are never applied); recorded with who, when and how many",
		Args:  oneParkID,
		RunE: func(cmd *cobra.Command, args []string) error {
			id, by, err := relayParkOp(args[0], subscription, by, a.getenv)
			if err != nil {
				return err
			}
			return a.withStore(cmd, func(store *postgres.Store) error {
				p, err := jetstream.DiscardPark(cmd.Context(), store, subscription, id, by)
				if err != nil {
					return err
				}
				_, err = fmt.Fprintf(a.out, "park %d: discarded %d messages of %s (recorded as discarded by %s); the stream is live again from its next message\n",
					id, p.Messages, relayParkStream(p), projector.Printable(p.ResolvedBy))
				return err
			})
		},
	}
	cmd.Flags().StringVar(&subscription, "subscription", "", "the consumer's subscription (required)")
	cmd.Flags().StringVar(&by, "by", "", "who is discarding, for the record (default $USER@host; without $USER the OS user, else the uid)")
	return cmd
}

func relayParkStream(p jetstream.Park) string {
	s := p.Stream()
	return projector.Printable(s.Type) + "/" + projector.Printable(s.ID) + " (tenant " + projector.Printable(s.Tenant) + ")"
}

// relayParkOp checks what a retry or discard of a claims consumer's park
// was given: the park id, the subscription (required) and the operator's
// name, defaulted.
func relayParkOp(arg, subscription, by string, getenv func(string) string) (int64, string, error) {
	id, err := parseParkID(arg)
	if err != nil {
		return 0, "", err
	}
	if err := validateSubscription(subscription, false); err != nil {
		return 0, "", err
	}
	if by, err = operatorName(by, getenv); err != nil {
		return 0, "", err
	}
	return id, by, nil
}
