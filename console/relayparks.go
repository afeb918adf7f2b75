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

	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/jetstream"
)

// relayConsumer returns the configured claims consumer of subscription, or
// an error matching ErrInvalidInput.
func (c *Console) relayConsumer(subscription string) (*jetstream.Consumer, error) {
	if err := checkName("subscription", subscription); err != nil {
		return nil, err
	}
	i := slices.IndexFunc(c.cfg.JetStreamConsumers, func(jc *jetstream.Consumer) bool { return jc.Subscription() == subscription })
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
	f := jetstream.ParkFilter{Subscription: sub, Limit: c.cfg.DeadLetterLimit}
	filter, ok := c.listParams(w, r, "park", &f.Status, &f.AfterID, projection.ParkOpen, projection.ParkResolved, projection.ParkDiscarded)
	if !ok {
		return
	}
	parks, err := jc.ListParks(r.Context(), f) // in the consumer's own database
	if err != nil {
		c.log.Error("console: list jetstream parks", slog.Any("error", err))
		c.reply(w, r, http.StatusInternalServerError, err.Error())
		return
	}
	d.Subscription, d.RelayParks, d.Filter = sub, parks, filter
	if len(parks) == f.Limit {
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
			p, err := jc.DiscardPark(ctx, id, by)
			if err != nil {
				return "", err
			}
			return fmt.Sprintf("park %d of %s discarded: %d messages dropped, kept for the record; the stream is live again from its next message",
				id, sub, p.Messages), nil
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
