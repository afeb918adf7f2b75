package jetstream

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

// Status is the relay's state for operators: the JetStream stream beside
// the relay consumer's shard, so lag on one side can be read against the
// other, and the claims consumers' open dead letters and parked streams.
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
	// last error), as `projector status` shows it; nil when the schema
	// read holds no relay of that name (a claims consumer's schema).
	Relay *projection.ShardState `json:"relay"`
	// Partitions are the partitions of a partitioned relay
	// (RelayConfig.Async.Partitions), in order, each with its cursor, lag
	// and owner; Relay is then the fence row, whose cursor does not move.
	Partitions []projection.ShardState `json:"partitions,omitempty"`
	// OpenDeadLetters counts, per schema and subscription with any, the
	// open dead letters of the claims consumers whose tables are in the
	// database read, whichever schema of it they use
	// ([CountOpenDeadLettersInDatabase]); empty when none are open. A
	// consumer with a database of its own has its count there.
	OpenDeadLetters []OpenDeadLetters `json:"open_dead_letters"`
	// ParkedStreams counts, per schema and subscription with any, the
	// streams the claims consumers (ErrorMode [ParkStream]) have parked and
	// no retry or discard has resolved yet
	// ([CountParkedStreamsInDatabase]); empty when none are.
	ParkedStreams []ParkedStreams `json:"parked_streams"`
}

// RelayStatus reads the stream's state from JetStream, the relay
// consumer's shard from store's schema, and the open dead letters of the
// claims consumers from every schema of store's database. It works
// pointed at either side: a schema without the relay (a claims consumer's)
// gives a nil Relay. A stream that does not exist matches jetstream's
// ErrStreamNotFound.
func RelayStatus(ctx context.Context, js jetstream.JetStream, store *postgres.Store, stream, consumer string) (Status, error) {
	var relay *projection.ShardState
	var partitions []projection.ShardState
	admin := projection.NewAdmin(store)
	shard, err := admin.Status(ctx, projection.ShardID{Consumer: consumer})
	switch {
	case err == nil:
		relay = &shard
	case !errors.Is(err, projector.ErrNotFound):
		return Status{}, fmt.Errorf("relay %s: %w", consumer, err)
	}
	if relay != nil && relay.Fence() {
		shards, err := admin.List(ctx, consumer)
		if err != nil {
			return Status{}, fmt.Errorf("relay %s: %w", consumer, err)
		}
		for _, s := range shards {
			if s.Partitions > 0 {
				partitions = append(partitions, s) // in partition order (Admin.List)
			}
		}
	}
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return Status{}, fmt.Errorf("relay stream %s: %w", stream, err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		return Status{}, fmt.Errorf("relay stream %s: %w", stream, err)
	}
	open, err := CountOpenDeadLettersInDatabase(ctx, store)
	if err != nil {
		return Status{}, err
	}
	parked, err := CountParkedStreamsInDatabase(ctx, store)
	if err != nil {
		return Status{}, err
	}
	return Status{
		Stream: stream, Subjects: info.Config.Subjects, Storage: info.Config.Storage.String(),
		DuplicateWindow: info.Config.Duplicates, Messages: info.State.Msgs, Bytes: info.State.Bytes,
		FirstSeq: info.State.FirstSeq, LastSeq: info.State.LastSeq, LastTime: info.State.LastTime,
		Relay: relay, Partitions: partitions, OpenDeadLetters: open, ParkedStreams: parked,
	}, nil
}

// countInDatabase counts, in every schema of store's database holding a
// table named table with a status column that this role may read, the rows
// in status (a constant of this package, written into the statement so the
// partial index of the open dead letters serves it) per subscription, as
// T's (schema, subscription, count) fields:
// the open dead letters and the parked streams that `projector relay
// status` shows. A consumer often keeps its tables in a schema of its own
// beside the relaying application's, so every schema is looked in. what
// begins the errors.
//
// It counts schema by schema: a schema dropped (or a table gone) between
// finding it and counting in it is passed over, whatever other sessions
// keep creating and dropping meanwhile; a single statement over every
// schema would fail as a whole.
func countInDatabase[T any](ctx context.Context, store *postgres.Store, what, table, status string) ([]T, error) {
	rows, err := store.Pool().Query(ctx, `SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE c.relname = $1 AND c.relkind = 'r'
		  AND has_schema_privilege(n.oid, 'USAGE') AND has_table_privilege(c.oid, 'SELECT')
		  AND EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attname = 'status' AND NOT a.attisdropped)
		ORDER BY n.nspname`, table)
	if err != nil {
		return nil, fmt.Errorf("%s: find the schemas: %w", what, err)
	}
	schemas, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("%s: find the schemas: %w", what, err)
	}
	out := []T{}
	for _, schema := range schemas {
		rows, err := store.Pool().Query(ctx, `SELECT $1::text, subscription, count(*) FROM `+
			pgx.Identifier{schema, table}.Sanitize()+` WHERE status = '`+status+`' GROUP BY subscription ORDER BY subscription`, schema)
		var counts []T
		if err == nil {
			counts, err = pgx.CollectRows(rows, pgx.RowToStructByPos[T])
		}
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && (pgErr.Code == "42P01" || pgErr.Code == "3F000") {
			continue // dropped since it was found
		}
		if err != nil {
			return nil, fmt.Errorf("%s in %q: %w", what, schema, err)
		}
		out = append(out, counts...)
	}
	return out, nil
}
