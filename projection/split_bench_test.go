package projection_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector/projection"
)

// BenchmarkPartitionSplitMerge times splitting every partition of a
// 4-partition consumer (4 → 8, one transaction) and merging them back
// (8 → 4: hold, then swap), no dispatcher running, beside the raw
// PostgreSQL floor of the same row swaps in the same run: one transaction
// taking the same advisory locks, inserting the halves' rows and deleting
// the parent's, on a copy of the consumers table. What the raw floor lacks
// is the layout re-read under the fence lock, the dead letters' and parks'
// move, and the merge's second transaction and poll.
func BenchmarkPartitionSplitMerge(b *testing.B) {
	e := partitioned(b)
	e.appendMany(2, 200, 40)
	p := counting(e.schema, e.types, "bench", projection.AsyncConfig{Partitions: 4})
	d := e.dispatcher(projection.Config{Projections: []*projection.Async{p}})
	if err := d.Stop(e.ctx); err != nil {
		b.Fatal(err)
	}
	admin := projection.NewAdmin(e.store)
	raw := e.table("raw_consumers")
	e.exec(`CREATE TABLE ` + raw + ` (LIKE ` + e.table("projector_consumers") + ` INCLUDING ALL)`)
	e.exec(`INSERT INTO ` + raw + ` SELECT * FROM ` + e.table("projector_consumers") + ` WHERE name = 'bench'`)
	rawSwap := func(from, to int) {
		err := pgx.BeginFunc(e.ctx, e.store.Pool(), func(tx pgx.Tx) error {
			for i := range from {
				parent := projection.PartitionInstance(i, from)
				if _, err := tx.Exec(e.ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1::text, 0))`, "raw"+parent); err != nil {
					return err
				}
				for c := range to / from {
					child := projection.PartitionInstance(i*to/from+c, to)
					if _, err := tx.Exec(e.ctx, `INSERT INTO `+raw+` (name, instance_id, cursor_tx_id, cursor_seq, version)
						SELECT name, $2, cursor_tx_id, cursor_seq, version FROM `+raw+` WHERE name = 'bench' AND instance_id = $1`, parent, child); err != nil {
						return err
					}
				}
				if _, err := tx.Exec(e.ctx, `DELETE FROM `+raw+` WHERE name = 'bench' AND instance_id = $1`, parent); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	var split, merge, rawSplit, rawMerge time.Duration
	for b.Loop() {
		began := time.Now()
		if _, err := admin.Split(e.ctx, "bench"); err != nil {
			b.Fatal(err)
		}
		split += time.Since(began)
		began = time.Now()
		if _, err := admin.Merge(e.ctx, "bench", 10*time.Second); err != nil {
			b.Fatal(err)
		}
		merge += time.Since(began)
		began = time.Now()
		rawSwap(4, 8)
		rawSplit += time.Since(began)
		began = time.Now()
		// The merge's raw floor: 8 → 4 is the same swap read the other way.
		err := pgx.BeginFunc(e.ctx, e.store.Pool(), func(tx pgx.Tx) error {
			for i := range 4 {
				kids := []string{projection.PartitionInstance(2*i, 8), projection.PartitionInstance(2*i+1, 8)}
				for _, k := range kids {
					if _, err := tx.Exec(e.ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1::text, 0))`, "raw"+k); err != nil {
						return err
					}
				}
				if _, err := tx.Exec(e.ctx, `INSERT INTO `+raw+` (name, instance_id, cursor_tx_id, cursor_seq, version)
					SELECT name, $2, cursor_tx_id, cursor_seq, version FROM `+raw+` WHERE name = 'bench' AND instance_id = $1`, kids[0], projection.PartitionInstance(i, 4)); err != nil {
					return err
				}
				if _, err := tx.Exec(e.ctx, `DELETE FROM `+raw+` WHERE name = 'bench' AND instance_id = ANY($1)`, kids); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
		rawMerge += time.Since(began)
	}
	n := float64(b.N)
	b.ReportMetric(float64(split.Milliseconds())/n, "split-ms")
	b.ReportMetric(float64(merge.Milliseconds())/n, "merge-ms")
	b.ReportMetric(float64(rawSplit.Milliseconds())/n, "raw-split-ms")
	b.ReportMetric(float64(rawMerge.Milliseconds())/n, "raw-merge-ms")
	b.Logf("4 partitions: split %s ms, merge %s ms; raw row swaps %s ms, %s ms (%d rounds)",
		strconv.FormatFloat(float64(split.Microseconds())/n/1000, 'f', 1, 64), strconv.FormatFloat(float64(merge.Microseconds())/n/1000, 'f', 1, 64),
		strconv.FormatFloat(float64(rawSplit.Microseconds())/n/1000, 'f', 1, 64), strconv.FormatFloat(float64(rawMerge.Microseconds())/n/1000, 'f', 1, 64), b.N)
}
