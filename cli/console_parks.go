package cli

import (
	"context"

	"github.com/projectorhq/projector/console"
	"github.com/projectorhq/projector/stores/jetstream"
)

// ConsoleParks wraps a JetStream claims consumer for
// console.Config.JetStreamConsumers, so that the console lists, retries and
// discards its parked streams without importing stores/jetstream. `projector
// run` wraps the consumers of Config.JetStreamConsumers itself; an
// application mounting the console on its own wraps its consumers with it.
// A nil consumer gives nil, which console.New refuses.
func ConsoleParks(c *jetstream.Consumer) console.ParkedConsumer {
	if c == nil {
		return nil
	}
	return consoleParks{c}
}

// consoleParks is ConsoleParks' adapter.
type consoleParks struct{ c *jetstream.Consumer }

func (p consoleParks) Subscription() string { return p.c.Subscription() }

func (p consoleParks) ListParks(ctx context.Context, status string, afterID int64, limit int) ([]console.RelayPark, error) {
	parks, err := p.c.ListParks(ctx, jetstream.ParkFilter{Subscription: p.c.Subscription(), Status: status, AfterID: afterID, Limit: limit})
	if err != nil {
		return nil, err
	}
	out := make([]console.RelayPark, len(parks))
	for i, k := range parks {
		out[i] = console.RelayPark{ID: k.ID, Subscription: k.Subscription, Tenant: k.Tenant, StreamType: k.StreamType,
			StreamID: k.StreamID, Status: k.Status, EventType: k.EventType, Version: k.Version, Error: k.Error,
			Failures: k.Failures, ParkedAt: k.ParkedAt, ResolvedBy: k.ResolvedBy, Messages: k.Messages}
	}
	return out, nil
}

func (p consoleParks) RetryPark(ctx context.Context, id int64, by string) (int, error) {
	return p.c.RetryPark(ctx, id, by)
}

func (p consoleParks) DiscardPark(ctx context.Context, id int64, by string) (int, error) {
	k, err := p.c.DiscardPark(ctx, id, by)
	return k.Messages, err
}
