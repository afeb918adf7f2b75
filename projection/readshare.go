package projection

import (
	"context"
	"slices"
	"strings"
	"sync"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/stores/postgres"
)

// sharedReads lets the shards of one dispatcher read a full batch of the
// log once when several of them stand at the same position with the same
// filter and batch size, as they do when many consumers catch up on the
// same backlog: each would otherwise read, and the server scan, the same
// rows once per consumer.
//
// Only full batches are shared, because only a full batch is final: it
// holds limit events after the position, all from transactions that had
// ended when it was read (promise 3), so every event between the position
// and its last one had ended too, and a read of the same query at any later
// moment returns exactly the same rows. (Retention cannot remove any of
// them: an enabled shard that has not passed them holds them back, and a
// disabled shard does not read.) A partial batch depends on the moment it
// was read, so a shard reading one reads it itself. A shared batch replaces
// only the read: each shard still takes its own lock, reads its own state,
// applies in its own transaction and moves its own cursor.
//
// Shards read concurrently up to the dispatcher's Concurrency: the first
// to ask for a batch reads it, and those asking for the same batch while it
// is being read wait for that read rather than starting their own. A
// shard's prefetch of its next batch asks here too, once it holds a
// connection: whoever creates an entry can always finish its read, so no
// waiter waits on a read that waits for a connection.
type sharedReads struct {
	mu      sync.Mutex
	entries map[readKey]*readEntry
	order   []readKey // oldest first, for eviction
	keep    int       // full batches kept
}

// readKey is what makes two shards' reads the same query.
type readKey struct {
	after projector.Position
	types string // the event-type filter, in a canonical form
	limit int
	// archived: the read includes the archive. The same rows either way
	// once both are full (a shard reads without it only when nothing is
	// archived after its position), but kept apart all the same.
	archived bool
}

type readEntry struct {
	done  chan struct{} // closed when the read finished
	batch postgres.LogBatch
	ok    bool // the read succeeded and was full: shareable
}

// newSharedReads returns the sharing for a dispatcher whose shards have
// the given filters, or nil when no two shards share a filter and nothing
// could ever be shared. It keeps up to two batches per shard: shards
// catching up together drift a few batches apart as they take turns at
// the dispatcher's concurrency limit.
func newSharedReads(filters []string) *sharedReads {
	seen := map[string]int{}
	shared := false
	for _, k := range filters {
		seen[k]++
		shared = shared || seen[k] > 1
	}
	if !shared {
		return nil
	}
	return &sharedReads{entries: map[readKey]*readEntry{}, keep: 2 * len(filters)}
}

// filterKey is a filter's canonical form: the same set of types in any
// order reads the same rows.
func filterKey(types []string) string {
	s := slices.Clone(types)
	slices.Sort(s)
	return strings.Join(slices.Compact(s), "\x00")
}

// read returns the batch of q, from another shard's read of the same full
// batch when there is one (shared), else from read(). The events returned
// are the caller's own: the dispatcher decodes payloads into them.
func (s *sharedReads) read(ctx context.Context, q postgres.LogQuery, types string, read func() (postgres.LogBatch, error)) (batch postgres.LogBatch, shared bool, err error) {
	key := readKey{after: q.After, types: types, limit: q.Limit, archived: q.IncludeArchived}
	s.mu.Lock()
	e, found := s.entries[key]
	if !found {
		e = &readEntry{done: make(chan struct{})}
		s.entries[key] = e
		s.order = append(s.order, key)
		s.evict()
	}
	s.mu.Unlock()

	if found {
		select {
		case <-e.done:
		case <-ctx.Done():
			return postgres.LogBatch{}, false, ctx.Err()
		}
		if e.ok {
			batch = e.batch
			batch.Events = copyEvents(batch.Events)
			return batch, true, nil
		}
		batch, err = read() // the other read failed or was partial: not shareable
		return batch, false, err
	}

	batch, err = read()
	if err == nil && batch.Full {
		e.batch, e.ok = batch, true
		e.batch.Events = copyEvents(batch.Events)
	}
	close(e.done)
	if !e.ok {
		s.mu.Lock()
		if s.entries[key] == e {
			delete(s.entries, key)
			s.order = slices.DeleteFunc(s.order, func(k readKey) bool { return k == key })
		}
		s.mu.Unlock()
	}
	return batch, false, err
}

// evict drops the oldest finished batches beyond keep. Called with mu held.
func (s *sharedReads) evict() {
	for len(s.order) > s.keep {
		k := s.order[0]
		s.order = s.order[1:]
		delete(s.entries, k)
	}
}

// copyEvents copies events and their payload bytes: each shard decodes
// into its own events, and a handler that changed an event's data in
// place must not change another shard's.
func copyEvents(events []projector.Event) []projector.Event {
	out := slices.Clone(events)
	for i := range out {
		out[i].Data = slices.Clone(out[i].Data)
	}
	return out
}
