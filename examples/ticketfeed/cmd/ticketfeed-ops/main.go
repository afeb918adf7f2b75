// Command ticketfeed-ops is the ticket feed's ops binary: Projector's
// command tree (cli) with the feed's registry and claims consumer wired in,
// so that besides `relay dead-letters list|show|discard` and `relay
// prune-claims` it can `relay dead-letters retry`, which runs the feed's
// handler. Point it at the feed's schema:
//
//	go run ./examples/ticketfeed/cmd/ticketfeed-ops --schema ticketfeed \
//	  relay dead-letters list --subscription ticketfeed
package main

import (
	"fmt"
	"os"

	"github.com/projectorhq/projector/cli"
	"github.com/projectorhq/projector/examples/ticketfeed"
	"github.com/projectorhq/projector/stores/jetstream"
	"github.com/projectorhq/projector/stores/postgres"
)

func main() {
	reg, err := ticketfeed.Registry()
	if err != nil {
		fmt.Fprintln(os.Stderr, "ticketfeed-ops:", err)
		os.Exit(1)
	}
	os.Exit(cli.Main(cli.Config{
		Name:     "ticketfeed-ops",
		Registry: reg,
		JetStreamConsumers: func(store *postgres.Store) ([]*jetstream.Consumer, error) {
			c, err := ticketfeed.NewConsumer(store)
			if err != nil {
				return nil, err
			}
			return []*jetstream.Consumer{c}, nil
		},
	}))
}
