package postgres

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"strings"

	"github.com/jackc/pgx/v5"
)

// StreamHash is the partition hash of a stream: the first four bytes,
// big-endian, of the SHA-256 of its tenant, stream type and stream id in
// UTF-8, joined by the unit separator 0x1f. The SQL function
// projector_stream_hash (migration 0017) computes the same, and the log is
// indexed on its top [BucketBits] bits. It is part of the stored format and
// never changes across releases.
func StreamHash(tenant, streamType, streamID string) uint32 {
	h := sha256.New()
	h.Write([]byte(tenant))
	h.Write([]byte{0x1f})
	h.Write([]byte(streamType))
	h.Write([]byte{0x1f})
	h.Write([]byte(streamID))
	var sum [sha256.Size]byte
	return binary.BigEndian.Uint32(h.Sum(sum[:0]))
}

// BucketBits is how many top bits of [StreamHash] the log's partition index
// holds (projector_stream_bucket): 2^BucketBits buckets, and so at most
// [MaxPartitions] partitions.
const BucketBits = 6

// MaxPartitions is the most partitions a consumer can have: one bucket of
// the partition index each.
const MaxPartitions = 1 << BucketBits

// Segment is a hash segment of the streams: those whose [StreamHash]'s top
// Bits bits equal Value. Partition p of N (N = 2^Bits) is Segment{Bits,
// p}. A segment splits into {Bits+1, 2·Value} and {Bits+1, 2·Value+1}, and
// two such siblings merge back, so partitions can be split and merged
// without moving a stream between unrelated partitions. The zero Segment
// holds every stream.
type Segment struct {
	Bits  uint8
	Value uint32
}

// SegmentOf returns partition p of n, n a power of two between 1 and
// [MaxPartitions].
func SegmentOf(p, n int) (Segment, error) {
	if n < 1 || n > MaxPartitions || n&(n-1) != 0 {
		return Segment{}, fmt.Errorf("partitions %d: want a power of two between 1 and %d", n, MaxPartitions)
	}
	if p < 0 || p >= n {
		return Segment{}, fmt.Errorf("partition %d of %d: want 0..%d", p, n, n-1)
	}
	return Segment{Bits: uint8(bits.TrailingZeros(uint(n))), Value: uint32(p)}, nil
}

// Count returns how many segments of this size cover every stream.
func (s Segment) Count() int { return 1 << s.Bits }

// Contains reports whether a stream with hash h belongs to the segment.
func (s Segment) Contains(h uint32) bool {
	if s.Bits == 0 {
		return true
	}
	return h>>(32-s.Bits) == s.Value
}

// Buckets returns the partition index's buckets (top [BucketBits] bits of
// the hash) the segment covers, in order.
func (s Segment) Buckets() []int16 {
	width := 1 << (BucketBits - s.Bits)
	out := make([]int16, width)
	for i := range out {
		out[i] = int16(int(s.Value)*width + i)
	}
	return out
}

// String renders the segment as partition/count, as status shows it.
func (s Segment) String() string { return fmt.Sprintf("%d/%d", s.Value, s.Count()) }

// PartitionIndex is the name of the index partitioned consumers read the
// log through: (projector_stream_bucket(tenant_id, stream_type, stream_id),
// tx_id, seq).
const PartitionIndex = "projector_events_partition"

// ErrNoPartitionIndex is returned by [Store.CheckPartitionIndex] when the
// log has no valid partition index. The index is opt-in: every append pays
// one more index entry and a hash for it (about a fifth of an append's
// throughput here, docs/performance.md), so only schemas with partitioned
// consumers carry it.
var ErrNoPartitionIndex = errors.New("the event log has no partition index")

// partitionIndexSQL builds the index without blocking appends. It cannot
// run in a transaction.
const partitionIndexSQL = `CREATE INDEX CONCURRENTLY IF NOT EXISTS ` + PartitionIndex + ` ON {{s}}.projector_events
	({{s}}.projector_stream_bucket(tenant_id, stream_type, stream_id), tx_id, seq)`

// PartitionIndexSQL returns the statement that creates the partition index
// of the store's schema, for an operator to run (outside a transaction).
func (s *Store) PartitionIndexSQL() string {
	return strings.ReplaceAll(partitionIndexSQL, "{{s}}", quoteIdent(s.schema))
}

// CheckPartitionIndex returns nil when the log's partition index exists and
// is valid, else an error matching [ErrNoPartitionIndex] that says how to
// create it.
func (s *Store) CheckPartitionIndex(ctx context.Context) error {
	var valid *bool
	err := s.pool.QueryRow(ctx, `SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
		JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relname = $2`, s.schema, PartitionIndex).Scan(&valid)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("%w (schema %s): partitioned consumers need it; create it once, without blocking appends, with\n  %s\n(or run `projector migrate partition-index`, or call Store.CreatePartitionIndex)", ErrNoPartitionIndex, s.schema, s.PartitionIndexSQL())
	case err != nil:
		return fmt.Errorf("check the partition index: %w", err)
	case valid == nil || !*valid:
		return fmt.Errorf("%w (schema %s): index %s is invalid (an interrupted CREATE INDEX CONCURRENTLY); drop it and create it again (Store.CreatePartitionIndex does both)", ErrNoPartitionIndex, s.schema, PartitionIndex)
	}
	return nil
}

// CreatePartitionIndex creates the partition index if it is missing, with
// CREATE INDEX CONCURRENTLY (appends go on meanwhile; on a large log it
// takes a while), replacing an invalid one an interrupted build left. Its
// role must own the events table.
func (s *Store) CreatePartitionIndex(ctx context.Context) error {
	err := s.CheckPartitionIndex(ctx)
	if err == nil {
		return nil
	}
	if !errors.Is(err, ErrNoPartitionIndex) {
		return err
	}
	if _, err := s.pool.Exec(ctx, `DROP INDEX CONCURRENTLY IF EXISTS `+quoteIdent(s.schema)+`.`+PartitionIndex+``); err != nil {
		return fmt.Errorf("drop an invalid partition index: %w", err)
	}
	if _, err := s.pool.Exec(ctx, s.PartitionIndexSQL()); err != nil {
		return fmt.Errorf("create the partition index: %w", err)
	}
	return s.CheckPartitionIndex(ctx)
}

// Children returns the two segments s splits into: the streams of s whose
// next hash bit is 0, and those whose next bit is 1. ok is false when s
// cannot split (it has [BucketBits] bits: one bucket of the partition
// index).
func (s Segment) Children() (lo, hi Segment, ok bool) {
	if s.Bits >= BucketBits {
		return Segment{}, Segment{}, false
	}
	return Segment{Bits: s.Bits + 1, Value: 2 * s.Value}, Segment{Bits: s.Bits + 1, Value: 2*s.Value + 1}, true
}

// Parent returns the segment s and its sibling merge into; ok is false for
// the zero Segment (every stream), which has none.
func (s Segment) Parent() (Segment, bool) {
	if s.Bits == 0 {
		return Segment{}, false
	}
	return Segment{Bits: s.Bits - 1, Value: s.Value / 2}, true
}

// Covers reports whether every stream of t is in s (t is s or lies inside it).
func (s Segment) Covers(t Segment) bool {
	return t.Bits >= s.Bits && t.Value>>(t.Bits-s.Bits) == s.Value
}
