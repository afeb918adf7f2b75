package cli

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/stores/jetstream"
	"github.com/projectorhq/projector/stores/postgres"
)

func (a *App) relayCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:  "relay",
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usageError{fmt.Errorf("unknown command %q for %q", args[0], cmd.CommandPath())}
			}
			return cmd.Help()
		},
		Short: "Inspect the relay of the log to NATS JetStream, purge consumer claims, handle consumer dead letters (see docs/jetstream.md)",
	}
	cmd.AddCommand(a.relayStatusCmd(), a.relayPruneClaimsCmd(), a.relayDeadLettersCmd())
	return cmd
}

func (a *App) relayStatusCmd() *cobra.Command {
	var natsURL, stream, consumer, output string
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show the JetStream stream (messages, bytes, sequences, duplicate window) beside the relay's lag, and the claims consumers' open dead letters",
		Long: `Show the JetStream stream (messages, bytes, sequences, duplicate window) beside the
relay consumer's shard (status, cursor, lag, attempts, last error), then the open dead
letters of the claims consumers whose tables are in this schema, per subscription
("open_dead_letters" in -o json). A consumer service with a store of its own has its dead
letters there: run relay dead-letters list against it. See docs/jetstream.md.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if output != "table" && output != "json" {
				return usageError{fmt.Errorf("-o %q: want table or json", output)}
			}
			if err := jetstream.ValidateStreamName(stream); err != nil {
				return usageError{fmt.Errorf("--stream: %w", err)}
			}
			url := cmp.Or(natsURL, os.Getenv("NATS_URL"), nats.DefaultURL)
			return a.withStore(cmd, func(store *postgres.Store) error {
				js, closeNATS, err := connectJetStream(url)
				if err != nil {
					return err
				}
				defer closeNATS()
				ctx, cancel := context.WithTimeout(cmd.Context(), 10*time.Second)
				defer cancel()
				st, err := jetstream.RelayStatus(ctx, js, store, stream, consumer)
				if err != nil {
					return err
				}
				if output == "json" {
					enc := json.NewEncoder(a.out)
					enc.SetIndent("", "  ")
					return enc.Encode(st)
				}
				r := st.Relay
				_, err = fmt.Fprintf(a.out, `STREAM %s (%s, subjects %s)
  messages          %d
  bytes             %d
  sequences         %d..%d
  last message      %s
  duplicate window  %v
RELAY %s
  status            %s (dispatcher %s)
  cursor            %s
  lag               %d events, oldest %.1fs
  attempts          %d
  last error        %s
`, st.Stream, st.Storage, strings.Join(st.Subjects, ","), st.Messages, st.Bytes, st.FirstSeq, st.LastSeq,
					st.LastTime.UTC().Format(time.RFC3339), st.DuplicateWindow, r.Consumer, r.Status, r.Dispatcher,
					r.Cursor, r.LagEvents, r.LagSeconds, r.Attempts, cmp.Or(r.LastError, "-"))
				if err != nil {
					return err
				}
				return a.writeOpenDeadLetters(st.OpenDeadLetters)
			})
		},
	}
	cmd.Flags().StringVar(&natsURL, "nats-url", "", "NATS server (default $NATS_URL or "+nats.DefaultURL+")")
	cmd.Flags().StringVar(&stream, "stream", jetstream.DefaultStreamName, "the relay's JetStream stream")
	cmd.Flags().StringVar(&consumer, "consumer", jetstream.DefaultRelayName, "the relay's consumer name")
	cmd.Flags().StringVarP(&output, "output", "o", "table", "table or json")
	return cmd
}

// writeOpenDeadLetters ends the text of `relay status`: the claims
// consumers' open dead letters per subscription, in this schema, and the
// command that lists them; one line when there are none.
func (a *App) writeOpenDeadLetters(open []jetstream.OpenDeadLetters) error {
	if len(open) == 0 {
		_, err := fmt.Fprintln(a.out, "CONSUMER DEAD LETTERS none open in this schema")
		return err
	}
	fmt.Fprintf(a.out, "CONSUMER DEAD LETTERS open, per subscription (%s relay dead-letters list --subscription S)\n", a.cfg.Name)
	for _, o := range open {
		if _, err := fmt.Fprintf(a.out, "  %-17s %d\n", projector.Printable(o.Subscription), o.Open); err != nil {
			return err
		}
	}
	return nil
}

// connectJetStream connects to the NATS server at url for one command;
// its errors never show the URL's credentials (ConnectNATS).
func connectJetStream(url string) (natsjs.JetStream, func(), error) {
	nc, err := ConnectNATS(url, nats.Timeout(5*time.Second))
	if err != nil {
		return nil, nil, err
	}
	js, err := natsjs.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("connect to JetStream at %s: %w", RedactNATSURL(url), scrubNATSError(err, url))
	}
	return js, nc.Close, nil
}
