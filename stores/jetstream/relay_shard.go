package jetstream

import (
	"context"
	"sync"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

// relayShard is what the relay keeps per shard of its consumer. An
// unpartitioned relay has one (projection.SharedInstance); a partitioned
// one (RelayConfig.Async.Partitions) one per partition, because each has
// its own cursor and its own passes: the events stored past a partition's
// cursor are its own streams' messages, and a pass's NATS failure is that
// pass's.
type relayShard struct {
	instance string
	// segment is the partition's hash segment; zero (every stream) when
	// the relay is not partitioned.
	segment postgres.Segment
	tail    tail
	failed  failedPass
}

// relayShards holds the relay's per-shard state, created on first use.
type relayShards struct {
	mu sync.Mutex
	m  map[string]*relayShard
}

// shardOf returns the state of the shard whose pass runs the handler with
// context ctx (the unpartitioned shard outside a dispatcher).
func (r *Relay) shardOf(ctx context.Context) *relayShard {
	instance := projection.SharedInstance
	if id, ok := projection.ShardFrom(ctx); ok {
		instance = id.Instance
	}
	s := &r.shards
	s.mu.Lock()
	defer s.mu.Unlock()
	if rs := s.m[instance]; rs != nil {
		return rs
	}
	rs := &relayShard{instance: instance}
	if p, n, ok := projection.ParsePartition(instance); ok {
		rs.segment, _ = postgres.SegmentOf(p, n) // ParsePartition checked it
	}
	if s.m == nil {
		s.m = map[string]*relayShard{}
	}
	s.m[instance] = rs
	return rs
}

// holds reports whether a relayed message m belongs to the shard's
// partition: its stream hashes into the segment. Every message does when
// the relay is not partitioned.
func (rs *relayShard) holds(m *jetstream.RawStreamMsg) bool {
	if rs.segment.Bits == 0 {
		return true
	}
	tenant, err1 := unescapeValue(m.Header.Get(HeaderTenant))
	typ, err2 := unescapeValue(m.Header.Get(HeaderStreamType))
	id, err3 := unescapeValue(m.Header.Get(HeaderStreamID))
	if err1 != nil || err2 != nil || err3 != nil {
		return false
	}
	return rs.segment.Contains(postgres.StreamHash(tenant, typ, id))
}
