package cli

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"

	"github.com/projectorhq/projector/stores/jetstream"
	"github.com/projectorhq/projector/stores/postgres"
)

// Bounds of `relay prune-claims`' durations: ten years is beyond any
// retention anyone means, and keeps the seconds PostgreSQL receives exact.
const maxClaimsDuration = 10 * 365 * 24 * time.Hour

// DefaultMaxRedelivery is `relay prune-claims --max-redelivery`: the
// redelivery time of a claims consumer with the defaults (5 deliveries,
// AckWait 30 s, nak backoff 1 s doubling), about 2m45s, rounded up with
// room to spare.
const DefaultMaxRedelivery = 10 * time.Minute

func (a *App) relayPruneClaimsCmd() *cobra.Command {
	var natsURL, stream, subscription string
	var olderThan, maxRedelivery time.Duration
	cmd := &cobra.Command{
		Use:   "prune-claims --older-than DURATION [--subscription S] [--stream PROJECTOR] [--max-redelivery D]",
		Short: "Delete JetStream consumer claims older than the retention window (run it against the consumer's database)",
		Long: `prune-claims deletes the claims (projector_jetstream_claims) older than --older-than
from the database and schema the claims consumer writes to: --database-url and --schema
name the consumer's store, which is often not the relaying application's, so this is not
part of ` + "`events prune`" + `.

A claim is what makes a message that comes again a no-op, so the window must be longer
than the relay stream's duplicate window (read from the stream --stream on --nats-url)
plus --max-redelivery (the longest a delivered message may be delivered again:
MaxDeliver × AckWait plus the nak backoffs; jetstream.Consumer.MaxRedelivery computes it).
A shorter window is refused with exit code 2 and nothing is deleted. The stream's
per-stream versions are kept, so an event older than a stream's last handled version is
still recognised after its claim is gone. See docs/jetstream.md.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if olderThan <= 0 || olderThan > maxClaimsDuration {
				return usageError{fmt.Errorf("--older-than %v: want a positive duration up to %v", olderThan, maxClaimsDuration)}
			}
			if maxRedelivery < 0 || maxRedelivery > maxClaimsDuration {
				return usageError{fmt.Errorf("--max-redelivery %v: want 0 up to %v", maxRedelivery, maxClaimsDuration)}
			}
			if err := validateSubscription(subscription, true); err != nil {
				return err
			}
			if err := jetstream.ValidateStreamName(stream); err != nil {
				return usageError{fmt.Errorf("--stream: %w", err)}
			}
			js, closeNATS, err := connectJetStream(cmp.Or(natsURL, a.getenv("NATS_URL"), nats.DefaultURL))
			if err != nil {
				return err
			}
			defer closeNATS()
			ctx, cancel := context.WithTimeout(cmd.Context(), 10*time.Second)
			defer cancel()
			s, err := js.Stream(ctx, stream)
			if err != nil {
				return fmt.Errorf("relay stream %s: %w", stream, err)
			}
			r := jetstream.ClaimsRetention{Subscription: subscription, OlderThan: olderThan,
				DuplicateWindow: s.CachedInfo().Config.Duplicates, MaxRedelivery: maxRedelivery}
			if err := r.Validate(); err != nil {
				return usageError{err}
			}
			return a.withStore(cmd, func(store *postgres.Store) error {
				n, err := jetstream.PurgeClaims(cmd.Context(), store, r)
				if err != nil {
					return err
				}
				_, err = fmt.Fprintf(a.out, "deleted %d claims older than %v (stream %s keeps duplicates %v, max redelivery %v)\n",
					n, olderThan, stream, r.DuplicateWindow, maxRedelivery)
				return err
			})
		},
	}
	f := cmd.Flags()
	f.DurationVar(&olderThan, "older-than", 0, "delete claims older than this (required; longer than the duplicate window plus --max-redelivery)")
	f.DurationVar(&maxRedelivery, "max-redelivery", DefaultMaxRedelivery, "the longest a delivered message may be delivered again")
	f.StringVar(&subscription, "subscription", "", "only this subscription's claims (default every subscription)")
	f.StringVar(&stream, "stream", jetstream.DefaultStreamName, "the relay's JetStream stream, whose duplicate window bounds the retention")
	f.StringVar(&natsURL, "nats-url", "", "NATS server (default $NATS_URL or "+nats.DefaultURL+")")
	return cmd
}

// validateSubscription checks a claims subscription name from the command
// line ("" allowed when optional).
func validateSubscription(s string, optional bool) error {
	if s == "" && optional {
		return nil
	}
	if err := jetstream.ValidateSubscription(s); err != nil {
		if errors.Is(err, jetstream.ErrInvalidConfig) {
			return usageError{fmt.Errorf("--subscription: %w", err)}
		}
		return err
	}
	return nil
}
