package projection

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/stores/postgres"
)

// ErrNoDispatcher: Emit was called outside a handler run by a dispatcher.
var ErrNoDispatcher = errors.New("projection: Emit called outside a dispatcher handler")

type storeKey struct{}

func withStore(ctx context.Context, s *postgres.Store) context.Context {
	return context.WithValue(ctx, storeKey{}, s)
}

// StoreFrom returns the store of the dispatcher running the handler whose
// context ctx is, and false outside a dispatcher's handler. For handlers
// that need to read committed state beside their transaction (the
// JetStream relay reads its own committed cursor to know which published
// events a crash may have left uncommitted) without being handed the store
// when they are built.
func StoreFrom(ctx context.Context) (*postgres.Store, bool) {
	s, ok := ctx.Value(storeKey{}).(*postgres.Store)
	return s, ok
}

type shardKey struct{}

// ShardFrom returns the shard whose pass runs the handler whose context
// ctx is, and false outside a dispatcher's handler. A handler that keeps
// state per shard finds its partition there (the JetStream relay keeps
// what it knows of the stream per partition: each has its own cursor).
func ShardFrom(ctx context.Context) (ShardID, bool) {
	id, ok := ctx.Value(shardKey{}).(ShardID)
	return id, ok
}

// Emit appends events from inside an async handler, through the
// dispatcher's store and the handler's transaction: they commit with the
// consumer's cursor, so each exists exactly once even across crashes, and
// they carry the handled event's correlation id with its id as causation.
// It is store.Append for handlers that were written without a store at
// hand (sagas, process managers).
//
// During a replay ([Replaying]) Emit appends nothing and returns an empty
// result: the live version appended those events when it first handled the
// event, and they are in the log already.
func Emit(ctx context.Context, tx pgx.Tx, stream projector.StreamRef, expected projector.ExpectedVersion, payloads ...any) (postgres.AppendResult, error) {
	s, ok := ctx.Value(storeKey{}).(*postgres.Store)
	if !ok {
		return postgres.AppendResult{}, ErrNoDispatcher
	}
	if Replaying(ctx) {
		return postgres.AppendResult{}, nil
	}
	return s.Append(ctx, tx, stream, expected, payloads...)
}
