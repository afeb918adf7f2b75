package projection

import (
	"strings"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/stores/postgres"
)

// Partitions by a key of the event's own (AsyncConfig.PartitionKey; sagas
// use their correlation key). A partition of such a consumer reads the log
// unfiltered by partition — SQL cannot compute a key the projection's Go
// code derives from the payload — and keeps the events whose key hashes
// into its segment (ownEvents). Its cursor still moves over every event it
// read, so every partition passes every event once and exactly one of them
// applies it.

// KeyHash is where an event with partition key key of consumer's events
// belongs when the consumer is partitioned by key:
// postgres.StreamHash(tenant, consumer, key), the stream hash with the
// consumer's name as the stream type, so SQL computes it too
// (projector_stream_hash(tenant_id, consumer, key): a saga's instances are
// placed by projector_stream_hash(tenant_id, saga, key)).
func KeyHash(tenant, consumer, key string) uint32 {
	return postgres.StreamHash(tenant, consumer, key)
}

// keyedFence starts the fence note of a consumer partitioned by key: the
// admin (which runs without the projection's code) reads it to count a
// keyed partition's lag over every event after its cursor, which is what
// it reads, rather than over its streams' buckets.
const keyedFence = "by key: "

// KeyedFenceNote reports whether note, a fence row's note (its
// last_error), marks a consumer partitioned by key: its partitions do not
// hold streams, so what places work by stream hash (a split, a rebuild's
// hand-over of dead letters) does not apply to it.
func KeyedFenceNote(note string) bool { return strings.HasPrefix(note, keyedFence) }

// keyedNote is the fence note of p: note, marked when p is partitioned by
// key.
func keyedNote(p *Async, note string) string {
	if p.cfg.PartitionKey != nil {
		return keyedFence + note
	}
	return note
}

// keyed reports whether sh is a partition of a consumer partitioned by key.
func (sh *shard) keyed() bool { return sh.balancer != nil && sh.proj.cfg.PartitionKey != nil }

// readSegment is the segment sh's read selects in SQL: its own for a
// partition by stream, none (the whole log) for one by key.
func (sh *shard) readSegment() postgres.Segment {
	if sh.proj.cfg.PartitionKey != nil {
		return postgres.Segment{}
	}
	return sh.segment
}

// needsPartitionIndex reports whether a shard reads by stream partition,
// through the partition index.
func (d *Dispatcher) needsPartitionIndex() bool {
	for _, sh := range d.shards {
		if sh.balancer != nil && !sh.keyed() {
			return true
		}
	}
	return false
}

// ownEvents returns the events of a keyed partition's batch that belong to
// it, their payloads decoded (the key function needs them; the handlers
// then do not decode them again). An event whose payload does not decode,
// or whose key function fails, belongs to its stream's partition, where
// its handler meets the same failure once: it is neither lost nor handled
// by every partition.
func (d *Dispatcher) ownEvents(sh *shard, events []projector.Event) []projector.Event {
	out := make([]projector.Event, 0, len(events))
	consumer, key := sh.proj.name, sh.proj.cfg.PartitionKey
	for _, ev := range events {
		h := postgres.StreamHash(ev.Stream.Tenant, ev.Stream.Type, ev.Stream.ID)
		if err := decodeEvent(d.store.Registry(), sh.proj.cfg.RawPayloads, &ev); err == nil {
			if k, err := key(ev); err == nil {
				h = postgres.StreamHash(ev.Stream.Tenant, consumer, k)
			}
		}
		if sh.segment.Contains(h) {
			out = append(out, ev)
		}
	}
	return out
}

// decodeEvent decodes ev's payload into its Go type, unless it is decoded
// already or the projection takes raw payloads.
func decodeEvent(reg *projector.Registry, raw bool, ev *projector.Event) error {
	if ev.Payload != nil || raw {
		return nil
	}
	payload, data, err := reg.Decode(ev.Type, ev.SchemaVersion, ev.Data)
	if err != nil {
		return err
	}
	ev.Payload, ev.Data = payload, data
	return nil
}
