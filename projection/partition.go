package projection

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/bits"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/stores/postgres"
)

// Partitioned consumers (docs/scaling.md, "Partitioned consumers").
//
// A consumer with AsyncConfig.Partitions = N > 1 has N shards, one per hash
// segment of the streams (postgres.Segment): partition p holds the streams
// whose postgres.StreamHash has p in its top log2(N) bits. Each partition is
// a shard like any other — state row, cursor, advisory lock, status,
// attempts, dead letters, metrics — whose instance id is reserved
// (PartitionInstance). A stream lives in one partition, so its events are
// applied in order (promise 4); every partition reads below the same
// horizon (promise 3); the advisory lock keeps one pass per partition at a
// time (promise 6), and the balancing on top (balance.go) only decides which
// process tries which partition.
//
// The consumer's unpartitioned row, (name, SharedInstance), stays as a
// fence: version PartitionedVersion and status disabled. A binary that does
// not know partitions registers that row (ON CONFLICT DO NOTHING: it finds
// the fence), reads a version that is not its own and stands aside as it
// does for a newer model version; retention passes over it (disabled).

// PartitionPrefix starts the reserved instance id of a partition's shard:
// PartitionPrefix + "p/N".
const PartitionPrefix = "__partition__"

// PartitionedVersion is the model version recorded on a partitioned
// consumer's unpartitioned row: no projection has it, so a dispatcher that
// would run the consumer unpartitioned (an older binary, or one declaring
// no partitions) stands aside instead of applying events twice.
const PartitionedVersion = math.MaxInt32

// ErrPartitionsChanged is returned by [Dispatcher.Start] when a consumer's
// declared partition count went down (or its partitions are of mixed sizes)
// and its partitions do not have that count yet: lowering the count is a
// live merge (`projector consumer merge`, [Admin.Merge]), which waits for
// the halves to meet, never a silent reshuffle; the error names the command
// to run. A raised count is carried out at start as splits.
var ErrPartitionsChanged = errors.New("projection dispatcher: partition count changed")

// PartitionInstance returns the instance id of partition p of n.
func PartitionInstance(p, n int) string {
	return PartitionPrefix + strconv.Itoa(p) + "/" + strconv.Itoa(n)
}

// ParsePartition returns the partition and count of a partition shard's
// instance id; ok is false for any other instance id.
func ParsePartition(instance string) (p, n int, ok bool) {
	rest, found := strings.CutPrefix(instance, PartitionPrefix)
	if !found {
		return 0, 0, false
	}
	ps, ns, found := strings.Cut(rest, "/")
	if !found {
		return 0, 0, false
	}
	p, err1 := strconv.Atoi(ps)
	n, err2 := strconv.Atoi(ns)
	if err1 != nil || err2 != nil {
		return 0, 0, false
	}
	if _, err := postgres.SegmentOf(p, n); err != nil {
		return 0, 0, false
	}
	return p, n, true
}

// validPartitions checks AsyncConfig.Partitions.
func validPartitions(cfg AsyncConfig) error {
	switch n := cfg.Partitions; {
	case n < 0 || n > postgres.MaxPartitions || (n > 1 && n&(n-1) != 0):
		return fmt.Errorf("partitions %d: want 0 or 1 (unpartitioned) or a power of two up to %d", n, postgres.MaxPartitions)
	case n > 1 && cfg.Delivery == PerInstance:
		return errors.New("partitions with per-instance delivery: every process applies every event of a per-instance consumer; partition a shared one")
	}
	return nil
}

// partitionSQL is what registration and balancing write about partitions.
type partitionSQL struct {
	fenceRow, fenceInfo, fence, insertFence, declare, partitions, insertPartition string
}

func buildPartitionSQL(store *postgres.Store) partitionSQL {
	c := store.Table("projector_consumers")
	return partitionSQL{
		fenceRow:  `SELECT version, cursor_tx_id, cursor_seq, coalesce(partitions, 0) FROM ` + c + ` WHERE name = $1 AND instance_id = '` + SharedInstance + `' FOR UPDATE`,
		fenceInfo: `SELECT version, coalesce(partitions, 0) FROM ` + c + ` WHERE name = $1 AND instance_id = '` + SharedInstance + `'`,
		fence: `UPDATE ` + c + ` SET version = ` + strconv.Itoa(PartitionedVersion) + `, status = 'disabled', attempts = 0,
				last_error = $2, last_error_at = NULL, failed_tx_id = NULL, failed_seq = NULL, failed_event_id = NULL,
				next_retry_at = NULL, updated_at = now()
			WHERE name = $1 AND instance_id = '` + SharedInstance + `'`,
		insertFence: `INSERT INTO ` + c + ` (name, instance_id, cursor_tx_id, cursor_seq, version, status, last_error)
			VALUES ($1, '` + SharedInstance + `', $2, $3, ` + strconv.Itoa(PartitionedVersion) + `, 'disabled', $4)
			ON CONFLICT (name, instance_id) DO NOTHING`,
		declare:         `UPDATE ` + c + ` SET partitions = $2 WHERE name = $1 AND instance_id = '` + SharedInstance + `' AND partitions IS DISTINCT FROM $2`,
		partitions:      `SELECT instance_id FROM ` + c + ` WHERE name = $1 AND instance_id LIKE '` + PartitionPrefix + `%' ORDER BY instance_id`,
		insertPartition: `INSERT INTO ` + c + ` (name, instance_id, cursor_tx_id, cursor_seq, version) VALUES ($1, $2, $3, $4, $5) ON CONFLICT (name, instance_id) DO NOTHING`,
	}
}

// fenceNote is what the fence row's last_error says, for an operator
// reading it with a binary that does not know partitions.
func fenceNote(n int) string {
	return fmt.Sprintf("partitioned into %d partitions (shards %s…%s); this row only fences binaries that do not know partitions", n, PartitionInstance(0, n), PartitionInstance(n-1, n))
}

// partitionSegment returns the hash segment of a partition shard's
// instance id; ok is false for any other instance id.
func partitionSegment(instance string) (postgres.Segment, bool) {
	p, n, ok := ParsePartition(instance)
	if !ok {
		return postgres.Segment{}, false
	}
	seg, err := postgres.SegmentOf(p, n)
	return seg, err == nil
}

// segmentInstance is the instance id of the partition of segment s.
func segmentInstance(s postgres.Segment) string {
	return PartitionInstance(int(s.Value), s.Count())
}

// uncovered returns the segments of declared (and below them) that no
// segment of layout covers: the partitions a consumer is missing, at the
// finest size its layout has there.
func uncovered(declared, layout []postgres.Segment) []postgres.Segment {
	var out []postgres.Segment
	var walk func(s postgres.Segment)
	walk = func(s postgres.Segment) {
		finer := false
		for _, l := range layout {
			if l.Covers(s) {
				return
			}
			finer = finer || s.Covers(l)
		}
		lo, hi, ok := s.Children()
		if !finer || !ok {
			out = append(out, s)
			return
		}
		walk(lo)
		walk(hi)
	}
	for _, s := range declared {
		walk(s)
	}
	return out
}

// checkDeclared refuses a change of the declared partition count that the
// consumer's partitions do not already have (splitToDeclared carried out a
// raised one already): a change of count is a live split or merge
// (split.go), never a silent reshuffle. recorded is the
// count the code last declared (0: not recorded).
func checkDeclared(name string, n, recorded int, layout []postgres.Segment) error {
	if len(layout) == 0 {
		return nil
	}
	sizes := map[int]bool{}
	for _, s := range layout {
		sizes[s.Count()] = true
	}
	uniform := 0
	if len(sizes) == 1 {
		uniform = layout[0].Count()
	}
	if recorded == 0 {
		recorded = cmp.Or(uniform, n)
	}
	if n == recorded || uniform == n {
		return nil // the code did not change, or operators resized it live already
	}
	name = projector.Printable(name)
	have := "partitions of mixed sizes (a split or merge is half done)"
	todo := fmt.Sprintf("projector consumer split|merge %s --partition P/N until every partition is one of %d", name, n)
	switch {
	case uniform > 0 && n > uniform:
		have = fmt.Sprintf("%d partitions", uniform)
		todo = strings.Repeat("projector consumer split "+name+"; ", bits.Len(uint(n/uniform))-1)
	case uniform > 0:
		have = fmt.Sprintf("%d partitions", uniform)
		todo = strings.Repeat("projector consumer merge "+name+"; ", bits.Len(uint(uniform/n))-1)
	}
	return fmt.Errorf("%w: consumer %s has %s and its code declared %d; this projection declares %d. Changing the count is a live split or merge, with no rebuild: run `%s` (each split doubles the partitions, each merge halves them), then start this version; or declare %d again",
		ErrPartitionsChanged, name, have, recorded, n, strings.TrimSuffix(todo, "; "), recorded)
}

// splitsToDeclared reports whether splitToDeclared splits layout: the code
// declares n partitions, more than the recorded count it last declared,
// and the partitions all have one size below n. Not when the consumer is
// new, the code did not change (the layout is what operators made it), or
// a split or merge is half done (checkDeclared says what to do).
func splitsToDeclared(n, recorded int, layout []postgres.Segment) bool {
	if len(layout) == 0 || recorded == n {
		return false
	}
	size := layout[0].Count()
	for _, s := range layout {
		if s.Count() != size {
			return false
		}
	}
	return size < n
}

// lockToRegister waits, in tx, for every lock registering the partitioned
// consumers will take, before any of it reads a row FOR UPDATE or writes,
// which gives tx a transaction id: waiting with one (for a running batch of
// a partition a raised count splits, or for another consumer's fence)
// would hold back the horizon of every consumer in the cluster for that
// long (promise 3; the lesson of lockPartitions). The fences are taken in
// consumer name order, each followed by the locks of the partitions its
// registration splits, read without locking under the fence, which every
// layout change takes: registerPartitioned then takes them again at once.
func (d *Dispatcher) lockToRegister(ctx context.Context, tx pgx.Tx) error {
	balancers := slices.Clone(d.balancers)
	slices.SortFunc(balancers, func(a, b *balancer) int { return cmp.Compare(a.consumer, b.consumer) })
	for _, b := range balancers {
		fence := ShardID{Consumer: b.consumer, Instance: SharedInstance}
		if _, err := tx.Exec(ctx, d.sql.waitLock, shardLockKey(d.store.Schema(), fence)); err != nil {
			return err
		}
		var version, recorded int
		err := tx.QueryRow(ctx, d.psql.fenceInfo, b.consumer).Scan(&version, &recorded)
		if errors.Is(err, pgx.ErrNoRows) || (err == nil && version != PartitionedVersion) {
			continue // new or unpartitioned: nothing to split
		}
		if err != nil {
			return err
		}
		rows, err := tx.Query(ctx, d.psql.partitions, b.consumer)
		if err != nil {
			return err
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return err
		}
		var layout []postgres.Segment
		ids = slices.DeleteFunc(ids, func(id string) bool {
			seg, ok := partitionSegment(id)
			if ok {
				layout = append(layout, seg)
			}
			return !ok
		})
		if b.proj.cfg.PartitionKey == nil && splitsToDeclared(b.proj.cfg.Partitions, recorded, layout) {
			if err := LockPartitions(ctx, tx, d.store, b.consumer, ids); err != nil {
				return err
			}
		}
	}
	return nil
}

// splitToDeclared carries out the splits a raised declared count asks for:
// when the code declares more partitions than it last did, and the
// partitions all have one size below it, each is split (in tx, under the
// fence lock registration holds, as `consumer split` would) until they are
// of the declared size. It returns the layout and ids after. A lowered
// count is not carried out: a merge waits for the halves to meet, which a
// start cannot, so checkDeclared refuses it with the command to run.
func (d *Dispatcher) splitToDeclared(ctx context.Context, tx pgx.Tx, name string, n, recorded int, layout []postgres.Segment, ids []string) ([]postgres.Segment, []string, error) {
	if !splitsToDeclared(n, recorded, layout) {
		return layout, ids, nil
	}
	size := layout[0].Count()
	from := size
	for size < n {
		changes, err := d.admin.splitMany(ctx, tx, name, layout, false, false) // size < n <= MaxPartitions: each has children; the locks are held already (lockToRegister)
		if err != nil {
			return nil, nil, err
		}
		var next []postgres.Segment
		for _, c := range changes {
			next = append(next, c.To...)
		}
		layout, size = next, size*2
	}
	ids = make([]string, len(layout))
	for i, s := range layout {
		ids[i] = segmentInstance(s)
	}
	if err := notifyLayout(ctx, tx, d.store, name); err != nil {
		return nil, nil, err
	}
	d.logger.InfoContext(ctx, "projection dispatcher: the declared partition count went up; partitions split, each half at its parent's cursor",
		slog.String("consumer", name), slog.Int("from", from), slog.Int("to", n))
	return layout, ids, nil
}

// registerPartitioned registers the shards of partitioned projection p in
// tx and returns the consumer's partitions (their instance ids): under the
// unpartitioned shard's lock, which live splits and merges take too
// (waiting for a pass of an older binary to end), it creates the fence and
// any partition missing, each starting where the unpartitioned consumer
// stood (it had applied every event of every partition up to there), or at
// start for a new consumer. The partitions a consumer has are the truth:
// operators split and merge them live, and a declared count the code
// changed is refused (checkDeclared) unless they already have it.
func (d *Dispatcher) registerPartitioned(ctx context.Context, tx pgx.Tx, p *Async, start projector.Position) ([]string, error) {
	n := p.cfg.Partitions
	unpartitioned := ShardID{Consumer: p.name, Instance: SharedInstance}
	if _, err := tx.Exec(ctx, d.sql.waitLock, shardLockKey(d.store.Schema(), unpartitioned)); err != nil {
		return nil, err
	}
	var version, recorded int
	var cursor projector.Position
	err := tx.QueryRow(ctx, d.psql.fenceRow, p.name).Scan(&version, &cursor.TxID, &cursor.Seq, &recorded)
	if errors.Is(err, pgx.ErrNoRows) {
		tag, ierr := tx.Exec(ctx, d.psql.insertFence, p.name, start.TxID, start.Seq, keyedNote(p, fenceNote(n)))
		if ierr != nil {
			return nil, ierr
		}
		if tag.RowsAffected() == 1 {
			version, cursor, err = PartitionedVersion, start, nil
		} else {
			// A binary that does not know partitions registered the
			// unpartitioned row meanwhile (its insert takes no advisory
			// lock; ours waited for its commit): read it again, now
			// committed, and convert it like any unpartitioned consumer.
			err = tx.QueryRow(ctx, d.psql.fenceRow, p.name).Scan(&version, &cursor.TxID, &cursor.Seq, &recorded)
		}
	}
	var layout []postgres.Segment
	var ids []string
	switch {
	case err != nil:
		return nil, err
	case version == PartitionedVersion:
		rows, err := tx.Query(ctx, d.psql.partitions, p.name)
		if err != nil {
			return nil, err
		}
		if ids, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
			return nil, err
		}
		ids = slices.DeleteFunc(ids, func(id string) bool {
			seg, ok := partitionSegment(id)
			if ok {
				layout = append(layout, seg)
			}
			return !ok
		})
		if p.cfg.PartitionKey != nil && len(layout) > 0 && len(layout) != n {
			return nil, fmt.Errorf("%w: consumer %s has %d partitions and this version declares %d: %w", ErrPartitionsChanged, projector.Printable(p.name), len(layout), n, keyedLayoutFixed(p.name))
		}
		if layout, ids, err = d.splitToDeclared(ctx, tx, p.name, n, recorded, layout, ids); err != nil {
			return nil, err
		}
		if err := checkDeclared(p.name, n, recorded, layout); err != nil {
			return nil, err
		}
		cursor = start // a partition row an operator removed starts over, as an unpartitioned one does
	case version != p.cfg.Version:
		return nil, fmt.Errorf("consumer %s is at model version %d and this projection is version %d: partition it once the versions agree (finish or cancel the rebuild)", p.name, version, p.cfg.Version)
	default:
		// An unpartitioned consumer becomes partitioned: its partitions
		// inherit its cursor, and its row becomes the fence.
		if _, err := tx.Exec(ctx, d.psql.fence, p.name, keyedNote(p, fenceNote(n))); err != nil {
			return nil, err
		}
		d.logger.InfoContext(ctx, "projection dispatcher: consumer partitioned; its partitions start at its cursor",
			slog.String("consumer", p.name), slog.Int("partitions", n), slog.String("cursor", cursor.String()))
	}
	if _, err := tx.Exec(ctx, d.psql.declare, p.name, n); err != nil {
		return nil, err
	}
	declared := make([]postgres.Segment, n)
	for i := range n {
		declared[i], _ = postgres.SegmentOf(i, n)
	}
	for _, s := range uncovered(declared, layout) {
		if _, err := tx.Exec(ctx, d.psql.insertPartition, p.name, segmentInstance(s), cursor.TxID, cursor.Seq, p.cfg.Version); err != nil {
			return nil, err
		}
		ids = append(ids, segmentInstance(s))
	}
	return ids, nil
}
