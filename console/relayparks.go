package console

// The JetStream claims consumers' parked streams (stores/jetstream,
// ErrorMode ParkStream): the page and actions `projector relay parked
// list|retry|discard` are on the command line, beside the dispatcher's
// parked streams (pages.go, actions.go). A retry runs the consumer's
// handler, so the console offers these only for the consumers it was
// given (Config.JetStreamConsumers), whose code is in its process.

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/projectorhq/projector/projection"
)

// ParkedConsumer is what the console needs of a JetStream claims consumer:
// its parks, listed, retried and discarded through the consumer's own
// guarded calls. cli.ConsoleParks makes one of a *jetstream.Consumer; the
// console does not import stores/jetstream (nor NATS with it).
type ParkedConsumer interface {
	// Subscription names the consumer.
	Subscription() string
	// ListParks lists parks of status ("" for all) with ids above afterID,
	// at most limit, oldest first, from the consumer's own database.
	ListParks(ctx context.Context, status string, afterID int64, limit int) ([]RelayPark, error)
	// RetryPark applies park id's sequence through the consumer's handler
	// and resolves it, returning how many messages it applied.
	RetryPark(ctx context.Context, id int64, by string) (int, error)
	// DiscardPark drops park id's sequence, returning how many messages it
	// held.
	DiscardPark(ctx context.Context, id int64, by string) (int, error)
}

// RelayPark is one parked stream of a JetStream claims consumer, as the
// console shows it (jetstream.Park's fields that the page reads).
type RelayPark struct {
	ID           int64
	Subscription string
	Tenant       string
	StreamType   string
	StreamID     string
	// Status is projection.ParkOpen, ParkResolved or ParkDiscarded.
	Status     string
	EventType  string
	Version    int64
	Error      string
	Failures   int
	ParkedAt   time.Time
	ResolvedBy string
	// Messages is how many messages the parked sequence holds.
	Messages int
}

// relayConsumer returns the configured claims consumer of subscription, or
// an error matching ErrInvalidInput.
func (c *Console) relayConsumer(subscription string) (ParkedConsumer, error) {
	if err := checkName("subscription", subscription); err != nil {
		return nil, err
	}
	i := slices.IndexFunc(c.cfg.JetStreamConsumers, func(jc ParkedConsumer) bool { return jc.Subscription() == subscription })
	if i < 0 {
		return nil, fmt.Errorf("%w: subscription %q is not one of this console's JetStream consumers", ErrInvalidInput, subscription)
	}
	return c.cfg.JetStreamConsumers[i], nil
}

// relayParked is the list of one subscription's parked streams
// (?subscription=, the first configured consumer's by default), open ones
// unless ?status= says otherwise, with retry and discard for a signed-in
// operator.
func (c *Console) relayParked(w http.ResponseWriter, r *http.Request) {
	d := c.page(r, "JetStream parked streams", nil)
	for _, jc := range c.cfg.JetStreamConsumers {
		d.Subscriptions = append(d.Subscriptions, jc.Subscription())
	}
	if len(d.Subscriptions) == 0 {
		c.render(w, r, http.StatusOK, "relay-parked.html", d)
		return
	}
	sub := r.URL.Query().Get("subscription")
	if sub == "" {
		sub = d.Subscriptions[0]
	}
	jc, err := c.relayConsumer(sub)
	if err != nil {
		c.reply(w, r, http.StatusBadRequest, err.Error())
		return
	}
	var status string
	var after int64
	filter, ok := c.listParams(w, r, "park", &status, &after, projection.ParkOpen, projection.ParkResolved, projection.ParkDiscarded)
	if !ok {
		return
	}
	limit := c.cfg.DeadLetterLimit
	parks, err := jc.ListParks(r.Context(), status, after, limit) // in the consumer's own database
	if err != nil {
		c.log.Error("console: list jetstream parks", slog.Any("error", err))
		c.reply(w, r, http.StatusInternalServerError, err.Error())
		return
	}
	d.Subscription, d.RelayParks, d.Filter = sub, parks, filter
	if len(parks) == limit {
		d.Next = parks[len(parks)-1].ID
	}
	c.render(w, r, http.StatusOK, "relay-parked.html", d)
}

// planRelayPark is plan for the relay-park actions: retry or discard park
// id of subscription, through the configured consumer of it, on behalf of
// the signed-in operator. Both are the consumer's guarded calls: of racing
// operators exactly one wins, the others are refused (409).
func (c *Console) planRelayPark(r *http.Request, op string) (string, func(context.Context) (string, error), error) {
	id, err := strconv.ParseInt(strings.TrimSpace(r.PostFormValue("id")), 10, 64)
	if err != nil || id < 1 {
		return "", nil, fmt.Errorf("%w: park id %q: want a positive number", ErrInvalidInput, r.PostFormValue("id"))
	}
	sub := r.PostFormValue("subscription")
	jc, err := c.relayConsumer(sub)
	if err != nil {
		return "", nil, err
	}
	by := "console: " + c.who(r).name
	target := fmt.Sprintf("jetstream park %d of %s", id, sub)
	if op == "discard" {
		return target, func(ctx context.Context) (string, error) {
			n, err := jc.DiscardPark(ctx, id, by)
			if err != nil {
				return "", err
			}
			return fmt.Sprintf("park %d of %s discarded: %d messages dropped, kept for the record; the stream is live again from its next message",
				id, sub, n), nil
		}, nil
	}
	return target, func(ctx context.Context) (string, error) {
		n, err := jc.RetryPark(ctx, id, by)
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("park %d of %s: applied its %d messages in order and resolved; the stream is live again", id, sub, n), nil
	}, nil
}
