package cli

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/projection"
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
		Short: "Inspect the relay of the log to NATS JetStream, purge consumer claims, handle consumer dead letters and parked streams (see docs/jetstream.md)",
	}
	cmd.AddCommand(a.relayStatusCmd(), a.relayPruneClaimsCmd(), a.relayDeadLettersCmd(), a.relayParkedCmd())
	return cmd
}

func (a *App) relayStatusCmd() *cobra.Command {
	var natsURL, stream, consumer, output string
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show the JetStream stream (messages, bytes, sequences, duplicate window) beside the relay's lag, and the claims consumers' open dead letters",
		Long: `Show the JetStream stream (messages, bytes, sequences, duplicate window) beside the
relay consumer's shard (status, cursor, lag, attempts, last error), then the open dead
letters of the claims consumers in every schema of the database, per schema and
subscription ("open_dead_letters" in -o json), and likewise their parked streams
(ErrorMode ParkStream; "parked_streams"). It works pointed at either side: in a
claims consumer's schema, which has no relay, it shows the stream and the dead letters
and says where the relay is not. A consumer service with a database of its own has its
dead letters there: run relay status or relay dead-letters list against it. See
docs/jetstream.md.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if output != "table" && output != "json" {
				return usageError{fmt.Errorf("-o %q: want table or json", output)}
			}
			if err := jetstream.ValidateStreamName(stream); err != nil {
				return usageError{fmt.Errorf("--stream: %w", err)}
			}
			if consumer == "" || len(consumer) > 200 || !utf8.ValidString(consumer) || strings.ContainsRune(consumer, 0) {
				return usageError{fmt.Errorf("--consumer %s: want the relay's consumer name (valid UTF-8, no NUL, up to 200 bytes)", quoted(consumer))}
			}
			url := cmp.Or(natsURL, a.getenv("NATS_URL"), nats.DefaultURL)
			return a.withStore(cmd, func(store *postgres.Store) error {
				js, closeNATS, err := connectJetStream(url)
				if err != nil {
					return err
				}
				defer closeNATS()
				ctx, cancel := context.WithTimeout(cmd.Context(), 10*time.Second)
				defer cancel()
				st, err := jetstream.RelayStatus(ctx, js, store, stream, consumer)
				if errors.Is(err, natsjs.ErrStreamNotFound) {
					return streamNotFound(ctx, js, stream, url)
				}
				if err != nil {
					return err
				}
				if output == "json" {
					enc := json.NewEncoder(a.out)
					enc.SetIndent("", "  ")
					return enc.Encode(st)
				}
				if _, err := fmt.Fprintf(a.out, `STREAM %s (%s, subjects %s)
  messages          %d
  bytes             %d
  sequences         %d..%d
  last message      %s
  duplicate window  %v
`, st.Stream, st.Storage, projector.Printable(strings.Join(st.Subjects, ",")), st.Messages, st.Bytes, st.FirstSeq, st.LastSeq,
					st.LastTime.UTC().Format(time.RFC3339), st.DuplicateWindow); err != nil {
					return err
				}
				relay := st.Relay
				status := ""
				if relay != nil && relay.Fence() {
					// The relay as its partitions make it (cli/fence.go).
					f := summarizeFence(*relay, st.Partitions)
					relay, status = &f.shard, f.statusCell()
				}
				if err := a.writeRelayShard(relay, status, consumer, store.Schema()); err != nil {
					return err
				}
				if err := a.writeRelayPartitions(st.Partitions); err != nil {
					return err
				}
				if err := a.writeOpenDeadLetters(st.OpenDeadLetters); err != nil {
					return err
				}
				return a.writeParkedStreams(st.ParkedStreams)
			})
		},
	}
	cmd.Flags().StringVar(&natsURL, "nats-url", "", "NATS server (default $NATS_URL or "+nats.DefaultURL+")")
	cmd.Flags().StringVar(&stream, "stream", jetstream.DefaultStreamName, "the relay's JetStream stream")
	cmd.Flags().StringVar(&consumer, "consumer", jetstream.DefaultRelayName, "the relay's consumer name")
	cmd.Flags().StringVarP(&output, "output", "o", "table", "table or json")
	return cmd
}

// streamNotFound is the error of `relay status` for a stream the server
// does not have: which flag names it, and the streams the server has, in
// place of NATS's bare "stream not found" (a 404).
func streamNotFound(ctx context.Context, js natsjs.JetStream, stream, url string) error {
	var names []string
	lister := js.StreamNames(ctx)
	for name := range lister.Name() {
		if len(names) == 20 {
			names = append(names, "…")
			break
		}
		names = append(names, projector.Printable(name))
	}
	have := "it has no streams"
	if len(names) > 0 {
		have = "its streams: " + strings.Join(names, ", ")
	}
	return &hiddenError{err: natsjs.ErrStreamNotFound, msg: fmt.Sprintf("no JetStream stream %q on NATS at %s: pass --stream with the relay's stream (RelayConfig.Stream, default %s); %s",
		stream, RedactNATSURL(url), jetstream.DefaultStreamName, have)}
}

// writeRelayShard prints the relay's shard for `relay status`, or where it
// is not: the schema read may be a claims consumer's.
// status, when not empty, replaces the shard's own (a partitioned relay's
// fence row).
func (a *App) writeRelayShard(r *projection.ShardState, status, consumer, schema string) error {
	if r == nil {
		_, err := fmt.Fprintf(a.out, "RELAY %s\n  not in schema %s (a claims consumer's schema?): pass the relaying application's --schema for the relay's lag\n",
			projector.Printable(consumer), projector.Printable(schema))
		return err
	}
	_, err := fmt.Fprintf(a.out, `RELAY %s
  status            %s (dispatcher %s)
  cursor            %s
  lag               %d events, oldest %.1fs
  attempts          %d
  last error        %s
`, projector.Printable(r.Consumer), cmp.Or(status, string(r.Status)), r.Dispatcher, cursor(r.Cursor), r.LagEvents, r.LagSeconds, r.Attempts,
		cmp.Or(text(r.LastError, 300), "-"))
	return err
}

// writeRelayPartitions lists a partitioned relay's partitions under its
// fence row: each one's status, owner, cursor and lag.
func (a *App) writeRelayPartitions(parts []projection.ShardState) error {
	if len(parts) == 0 {
		return nil
	}
	w := tabwriter.NewWriter(a.out, 0, 0, 2, ' ', 0)
	for _, p := range parts {
		fmt.Fprintf(w, "  partition %d/%d\t%s\towner %s\tcursor %s\tlag %d events, oldest %.1fs\t%s\n", p.Partition, p.Partitions, p.Status,
			cmp.Or(projector.Printable(p.Owner), "-"), cursor(p.Cursor), p.LagEvents, p.LagSeconds, cmp.Or(text(p.LastError, 200), "-"))
	}
	return w.Flush()
}

// writeOpenDeadLetters ends the text of `relay status`: the claims
// consumers' open dead letters per schema and subscription, in the
// database read, and the command that lists them; one line when there are
// none.
func (a *App) writeOpenDeadLetters(open []jetstream.OpenDeadLetters) error {
	if len(open) == 0 {
		_, err := fmt.Fprintln(a.out, "CONSUMER DEAD LETTERS none open in this database")
		return err
	}
	fmt.Fprintf(a.out, "CONSUMER DEAD LETTERS open, per schema and subscription (%s relay dead-letters list --schema SCHEMA --subscription S)\n", a.cfg.Name)
	w := tabwriter.NewWriter(a.out, 0, 0, 2, ' ', 0)
	for _, o := range open {
		fmt.Fprintf(w, "  %s\t%s\t%d\n", projector.Printable(o.Schema), projector.Printable(o.Subscription), o.Open)
	}
	return w.Flush()
}

// writeParkedStreams ends the text of `relay status`: the claims
// consumers' parked streams per schema and subscription, in the database
// read; one line when there are none.
func (a *App) writeParkedStreams(parked []jetstream.ParkedStreams) error {
	if len(parked) == 0 {
		_, err := fmt.Fprintln(a.out, "CONSUMER PARKED STREAMS none in this database")
		return err
	}
	fmt.Fprintf(a.out, "CONSUMER PARKED STREAMS per schema and subscription (%s relay parked list --schema SCHEMA --subscription S)\n", a.cfg.Name)
	w := tabwriter.NewWriter(a.out, 0, 0, 2, ' ', 0)
	for _, p := range parked {
		fmt.Fprintf(w, "  %s\t%s\t%d\n", projector.Printable(p.Schema), projector.Printable(p.Subscription), p.Parked)
	}
	return w.Flush()
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
