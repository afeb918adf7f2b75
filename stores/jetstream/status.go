package jetstream

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

// Status is the relay's state for operators: the JetStream stream beside
// the relay consumer's shard, so lag on one side can be read against the
// other.
type Status struct {
	Stream          string        `json:"stream"`
	Subjects        []string      `json:"subjects"`
	Storage         string        `json:"storage"`
	DuplicateWindow time.Duration `json:"duplicate_window_ns"`
	Messages        uint64        `json:"messages"`
	Bytes           uint64        `json:"bytes"`
	FirstSeq        uint64        `json:"first_seq"`
	LastSeq         uint64        `json:"last_seq"`
	LastTime        time.Time     `json:"last_time"`
	// Relay is the relay consumer's shard (status, cursor, lag, attempts,
	// last error), as `projector status` shows it.
	Relay projection.ShardState `json:"relay"`
	// OpenDeadLetters counts, per subscription with any, the open dead
	// letters of the claims consumers whose tables are in the same schema
	// ([CountOpenDeadLetters]); empty when none are open, or when the
	// consumers keep their claims in a schema of their own.
	OpenDeadLetters []OpenDeadLetters `json:"open_dead_letters"`
}

// RelayStatus reads the stream's state from JetStream, and the relay
// consumer's shard and the open dead letters of the claims consumers from
// store. A relay that never ran is
// projector.ErrNotFound; a stream that does not exist, jetstream's
// ErrStreamNotFound.
func RelayStatus(ctx context.Context, js jetstream.JetStream, store *postgres.Store, stream, consumer string) (Status, error) {
	shard, err := projection.NewAdmin(store).Status(ctx, projection.ShardID{Consumer: consumer})
	if err != nil {
		return Status{}, fmt.Errorf("relay %s: %w", consumer, err)
	}
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return Status{}, fmt.Errorf("relay stream %s: %w", stream, err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		return Status{}, fmt.Errorf("relay stream %s: %w", stream, err)
	}
	open, err := CountOpenDeadLetters(ctx, store)
	if err != nil {
		return Status{}, err
	}
	return Status{
		Stream: stream, Subjects: info.Config.Subjects, Storage: info.Config.Storage.String(),
		DuplicateWindow: info.Config.Duplicates, Messages: info.State.Msgs, Bytes: info.State.Bytes,
		FirstSeq: info.State.FirstSeq, LastSeq: info.State.LastSeq, LastTime: info.State.LastTime,
		Relay: shard, OpenDeadLetters: open,
	}, nil
}
