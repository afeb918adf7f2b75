package helpdesk

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/projectorhq/projector/cli"
	"github.com/projectorhq/projector/examples/ticketfeed"
	"github.com/projectorhq/projector/stores/jetstream"
	"github.com/projectorhq/projector/stores/postgres"
)

// demoRelay relays the demo's events to NATS JetStream (NATS_URL, default
// the local server) and runs the ticketfeed example against them: a second
// service counting ticket events into its own schema with claims. When NATS
// does not answer it says so and skips the relay.
func demoRelay(ctx context.Context, store *postgres.Store, out io.Writer) error {
	url := cmp.Or(os.Getenv("NATS_URL"), nats.DefaultURL)
	nc, err := cli.ConnectNATS(url, nats.Timeout(2*time.Second))
	if err != nil {
		fmt.Fprintf(out, "\n(NATS at %s does not answer: skipped the relay to JetStream)\n", cli.RedactNATSURL(url))
		return nil
	}
	defer nc.Close()
	// The demo's stream and prefix are named after its schema, so a rerun
	// starts from an empty stream and never touches another's.
	stream := "DEMO_" + strings.ToUpper(store.Schema())
	prefix := store.Schema()
	js, err := natsjs.New(nc)
	if err != nil {
		return err
	}
	if err := js.DeleteStream(ctx, stream); err != nil && !errors.Is(err, natsjs.ErrStreamNotFound) {
		return fmt.Errorf("demo relay: reset stream %s: %w", stream, err)
	}
	relay, err := jetstream.NewRelay(jetstream.RelayConfig{Conn: nc, Registry: store.Registry(), Stream: stream, Prefix: prefix, Storage: natsjs.MemoryStorage})
	if err != nil {
		return err
	}
	if _, err := relay.Ensure(ctx); err != nil {
		return err
	}
	if err := catchUpWith(ctx, store, out, relay.Async()); err != nil {
		return err
	}
	st, err := jetstream.RelayStatus(ctx, js, store, stream, jetstream.DefaultRelayName)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "\n== Relay to NATS JetStream (`projector relay status`)\nstream %s on %s: %d messages, %d bytes, duplicate window %v; relay lag %d events\n",
		stream, cli.RedactNATSURL(url), st.Messages, st.Bytes, st.DuplicateWindow, relayLag(st))

	var tickets uint64
	if s, err := js.Stream(ctx, stream); err == nil {
		info, err := s.Info(ctx, natsjs.WithSubjectFilter(prefix+".*.ticket.>"))
		if err != nil {
			return err
		}
		for _, n := range info.State.Subjects {
			tickets += n
		}
	}
	// The feed keeps its claims and its table in the demo's schema, so the
	// demo's reset clears them too; a real service has a database of its own.
	feed, err := ticketfeed.Start(ctx, store.Pool(), js, store.Schema(), stream, prefix)
	if err != nil {
		return err
	}
	defer feed.Stop()
	deadline := time.Now().Add(time.Minute)
	for {
		counts, err := feed.Counts(ctx)
		if err != nil {
			return err
		}
		var total int64
		for _, n := range counts {
			total += n
		}
		if uint64(total) >= tickets || time.Now().After(deadline) {
			fmt.Fprintf(out, "ticketfeed (examples/ticketfeed) consumed %d of %d ticket events with claims, once each:\n", total, tickets)
			for _, typ := range slices.Sorted(maps.Keys(counts)) {
				fmt.Fprintf(out, "  %-18s %d\n", typ, counts[typ])
			}
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond): // poll the feed's table
		}
	}
}

// relayLag is the relay's lag in events, 0 when its shard is not in the
// schema read.
func relayLag(st jetstream.Status) int64 {
	if st.Relay == nil {
		return 0
	}
	return st.Relay.LagEvents
}
