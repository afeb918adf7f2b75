package rebuild_test

import (
	"context"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/rebuild"
)

// A live shard whose cursor is past the switch's, which the switching
// pass's locks rule out, is refused loudly: here live partition 0's cursor
// is moved in SQL (outside any pass, ignoring its lock) while the
// switching pass applies the gap up to where it stood. The switch rolls
// back rather than give the partition the switch's cursor with a replay
// mark (its streams' rows behind what readers had seen until it replayed);
// the next switching pass reads the frontiers again and switches with no
// partition replaying, and a reader never sees a stream's count go back.
func TestBlueGreenSwitchRefusesALiveShardPastItsCursor(t *testing.T) {
	t.Parallel()
	e := partitionedEnv(t)
	var moved atomic.Bool
	e.shadowFault = func(ctx context.Context, ev projector.Event) error {
		// s4…s7's events of partition 0 are applied only in the gap,
		// under every partition's lock, after the frontiers were read.
		if ev.Stream.ID < "s4" || ev.Stream.ID > "s7" || ev.Version != 2 || !moved.CompareAndSwap(false, true) {
			return nil
		}
		_, err := e.store.Pool().Exec(ctx, `UPDATE `+e.store.Table("projector_consumers")+` SET (cursor_tx_id, cursor_seq) =
				(SELECT tx_id, seq FROM `+e.store.Table("projector_events")+` ORDER BY tx_id DESC, seq DESC LIMIT 1)
			WHERE name = 'counter' AND instance_id = $1`, projection.PartitionPrefix+"0/2")
		return err
	}
	e.laggingPartitions()
	wentBack := e.watchCounts()
	logs := &pgtest.SyncBuffer{}
	v2 := startDispatcher(t, e.store, projection.Config{InstanceID: "v2", Logger: slog.New(slog.NewTextHandler(logs, nil))},
		e.sideEffects(2, 2, 0))
	if _, err := rebuild.Request(e.ctx, e.store, "counter", rebuild.Options{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 45*time.Second, "the rebuild to switch", func() bool {
		r, err := rebuild.Current(e.ctx, e.store, "counter")
		return err == nil && r.Status == rebuild.Switched
	})
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	if err := v2.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	if msg := wentBack(); msg != "" {
		t.Errorf("a reader saw the model go back in time across the switch: %s", msg)
	}
	if !moved.Load() {
		t.Fatal("no switching pass applied a gap event: partition 0's cursor was never moved in its window")
	}
	if !strings.Contains(logs.String(), "rebuild switch refused: a live shard had handled events past the switch's cursor") {
		t.Errorf("the switch with live partition 0 past its cursor was not refused; the log:\n%s", logs.String())
	}
	for k := range e.effects() {
		if strings.HasSuffix(k, "@v-2") {
			t.Errorf("%s: live partition 0 replayed it after the switch, its streams' rows behind what readers saw", k)
		}
	}
	var diff int64
	if err := e.store.Pool().QueryRow(e.ctx, `WITH fresh AS (
			SELECT stream_id, count(*)::int AS n FROM `+e.store.Table("projector_events")+` WHERE stream_type = 'ticket' GROUP BY stream_id)
		SELECT count(*) FROM fresh f FULL JOIN `+pgx.Identifier{e.schema, "counts"}.Sanitize()+` c USING (stream_id)
		WHERE f.n IS DISTINCT FROM c.n OR c.v IS DISTINCT FROM 2`).Scan(&diff); err != nil || diff != 0 {
		t.Fatalf("after the switch the model differs from the log in %d rows (%v)", diff, err)
	}
}
