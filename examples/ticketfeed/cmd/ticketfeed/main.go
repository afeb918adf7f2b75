// Command ticketfeed consumes the helpdesk's relayed ticket events from
// NATS JetStream into its own PostgreSQL schema with exactly-once effects,
// printing the counts per event type every few seconds until interrupted.
//
//	PROJECTOR_DATABASE_URL=postgres://... NATS_URL=nats://127.0.0.1:4222 \
//	  go run ./examples/ticketfeed/cmd/ticketfeed -stream PROJECTOR -prefix projector
package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/projectorhq/projector/cli"
	"github.com/projectorhq/projector/examples/ticketfeed"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "ticketfeed:", err)
		os.Exit(1)
	}
}

func run() error {
	schema := flag.String("schema", "ticketfeed", "the feed's own schema")
	stream := flag.String("stream", "PROJECTOR", "the relay's JetStream stream")
	prefix := flag.String("prefix", "projector", "the relay's subject prefix")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	pool, err := pgxpool.New(ctx, os.Getenv("PROJECTOR_DATABASE_URL"))
	if err != nil {
		return err
	}
	defer pool.Close()
	// cli.ConnectNATS keeps the URL's credentials out of its errors.
	nc, err := cli.ConnectNATS(cmp.Or(os.Getenv("NATS_URL"), nats.DefaultURL), nats.MaxReconnects(-1))
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := natsjs.New(nc)
	if err != nil {
		return err
	}
	feed, err := ticketfeed.Start(ctx, pool, js, *schema, *stream, *prefix)
	if err != nil {
		return err
	}
	defer feed.Stop()
	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			counts, err := feed.Counts(ctx)
			if err != nil {
				return err
			}
			fmt.Println(counts)
		}
	}
}
