package projection

import (
	"context"
	"strconv"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector/stores/postgres"
)

// A partition's load, for operators (status, the console): how fast events
// arrive in its streams, and whether one partition takes far more than its
// share (a hot partition: one stream, or a few, far busier than the rest,
// which adding processes cannot spread since a stream lives in one
// partition).

// LoadWindow is how many of the log's latest events a partition's InRate and
// Skew are measured over: read newest first through the log's primary key,
// one hash per stream among them, so a status costs the same on any log.
const LoadWindow = 10_000

// MinLoadSample is the fewest events in the window for a Skew to be given:
// below it, shares are noise.
const MinLoadSample = 100

// HotSkew is the Skew from which a partition counts as hot: twice its even
// share of the recent events.
const HotSkew = 2.0

// Hot reports a partition that took HotSkew times its even share of the
// log's recent events or more.
func (s ShardState) Hot() bool { return s.Partitions > 0 && s.Skew >= HotSkew }

// partitionLoad fills InRate and Skew of the partitions among shards from the
// log's last LoadWindow events, counted per bucket of the partition index
// (a partition p of n holds buckets [p·64/n, (p+1)·64/n)), in one
// statement, run only if there are partitions.
func (a *Admin) partitionLoad(ctx context.Context, shards []ShardState) error {
	parted := false
	for _, s := range shards {
		parted = parted || s.Partitions > 0
	}
	if !parted {
		return nil
	}
	var buckets [postgres.MaxPartitions]int64
	var total int64
	var span float64
	// Hashed once per stream of the window, not per event: measured on a
	// window of 10,000 events over 1,000 streams, 23–28 ms against 94–116
	// ms hashing each event (reading the window alone: 2 ms; load 12–16 on
	// 2 cores).
	rows, err := a.store.Pool().Query(ctx, `WITH w AS (
			SELECT tenant_id, stream_type, stream_id, recorded_at FROM `+a.store.Table("projector_events")+`
			ORDER BY tx_id DESC, seq DESC LIMIT `+strconv.Itoa(LoadWindow)+`),
		s AS (SELECT tenant_id, stream_type, stream_id, count(*) AS n, min(recorded_at) AS oldest FROM w GROUP BY 1, 2, 3)
		SELECT `+a.store.Schema()+`.projector_stream_bucket(tenant_id, stream_type, stream_id)::int, sum(n)::bigint,
			coalesce(extract(epoch FROM now() - min(min(oldest)) OVER ()), 0)::float8
		FROM s GROUP BY 1`)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var b int
		var n int64
		if err := rows.Scan(&b, &n, &span); err != nil {
			return err
		}
		if b >= 0 && b < len(buckets) {
			buckets[b] = n
			total += n
		}
	}
	if err := rows.Err(); err != nil {
		return err
	}
	span = max(span, 1) // a window younger than a second: per second, as if it were one
	keyed, err := a.keyedConsumers(ctx)
	if err != nil {
		return err
	}
	for i := range shards {
		s := &shards[i]
		if s.Partitions == 0 || keyed[s.Consumer] {
			continue // a partition by key (a saga) holds keys, not these streams: not measured
		}
		width := postgres.MaxPartitions / s.Partitions
		var n int64
		for _, c := range buckets[s.Partition*width : (s.Partition+1)*width] {
			n += c
		}
		s.InRate = float64(n) / span
		if total >= MinLoadSample {
			s.Skew = float64(n) * float64(s.Partitions) / float64(total)
		}
	}
	return nil
}

// keyedConsumers returns the consumers partitioned by key (their fence note
// says so, see KeyedFenceNote), whose partitions' load the streams' hashes
// do not tell.
func (a *Admin) keyedConsumers(ctx context.Context) (map[string]bool, error) {
	rows, err := a.store.Pool().Query(ctx, `SELECT name FROM `+a.store.Table("projector_consumers")+`
		WHERE instance_id = '`+SharedInstance+`' AND version = `+strconv.Itoa(PartitionedVersion)+` AND starts_with(last_error, '`+keyedFence+`')`)
	if err != nil {
		return nil, err
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, err
	}
	out := make(map[string]bool, len(names))
	for _, n := range names {
		out[n] = true
	}
	return out, nil
}
