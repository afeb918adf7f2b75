package projection

import (
	"context"
	"fmt"

	"github.com/projectorhq/projector/stores/postgres"
)

// lockHeldSQL reports whether any session holds one of the advisory locks
// named by $1 (shard lock keys, hashed as waitShardLockSQL hashes them),
// read from pg_locks without taking them. A bigint advisory key shows
// there with its high half in classid, its low half in objid and objsubid
// 1 (PostgreSQL's documentation of pg_locks).
const lockHeldSQL = `SELECT EXISTS (SELECT 1 FROM pg_locks l
	WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
	  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
	  AND ((l.classid::bigint << 32) | l.objid::bigint) = ANY (SELECT hashtextextended(k, 0) FROM unnest($1::text[]) k))`

// ShardsLocked reports whether some session holds the advisory lock of
// any of the shards ids of store's schema right now — a pass applying a
// batch, or an operator transition — without taking it, so it never
// delays a pass. A reader that reads a shard's cursor, then something the
// shard's passes write outside the database (a search index on another
// engine), then finds the lock free and reads the cursor again, knows that
// every pass that wrote before the check has ended: committed (its cursor
// advance visible to the second read, as PostgreSQL makes a commit visible
// before it releases the transaction's locks) or rolled back.
func ShardsLocked(ctx context.Context, store *postgres.Store, ids ...ShardID) (bool, error) {
	keys := make([]string, len(ids))
	for i, id := range ids {
		keys[i] = shardLockKey(store.Schema(), id.normal())
	}
	var held bool
	if err := store.Pool().QueryRow(ctx, lockHeldSQL, keys).Scan(&held); err != nil {
		return false, fmt.Errorf("read the shards' locks: %w", err)
	}
	return held, nil
}
