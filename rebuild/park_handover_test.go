package rebuild_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/rebuild"
)

// parkCounter is the counter under ParkStream (MaxAttempts 1), counting
// each stream's events into n and its last applied stream version into v.
// Version 1 fails on every event of stream "p"; later versions fail on p's
// events from stream version 2 on while stillFailing is set. A handler
// given an event that does not follow the last one applied of its stream
// (out of order, or twice) counts it in outOfOrder.
func (e *env) parkCounter(version, partitions int, stillFailing *atomic.Bool, outOfOrder *atomic.Int64) *projection.Async {
	p := projection.NewAsync("counter", projection.AsyncConfig{Version: version, Tables: []string{e.table}, Partitions: partitions,
		ErrorMode: projection.ParkStream, MaxAttempts: 1})
	h := func(ctx context.Context, tx pgx.Tx, ev projector.Event) error {
		if ev.Stream.ID == "p" && (version == 1 || (stillFailing.Load() && ev.Version >= 2)) {
			return fmt.Errorf("v%d cannot handle p v%d", version, ev.Version)
		}
		table := projection.Table(ctx, e.table)
		var last int64
		err := tx.QueryRow(ctx, `SELECT v FROM `+table+` WHERE stream_id = $1`, ev.Stream.ID).Scan(&last)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		if ev.Version != last+1 {
			outOfOrder.Add(1)
		}
		_, err = tx.Exec(ctx, `INSERT INTO `+table+` AS c (stream_id, n, v) VALUES ($1, 1, $2)
			ON CONFLICT (stream_id) DO UPDATE SET n = c.n + 1, v = $2`, ev.Stream.ID, ev.Version)
		return err
	}
	must(projection.OnEvent(p, e.types.Opened, h))
	must(projection.OnEvent(p, e.types.Commented, h))
	return p
}

// openParks returns the counter's open parks, the shadow's included.
func (e *env) openParks() []projection.Park {
	e.t.Helper()
	parks, err := projection.ListParks(e.ctx, e.store, projection.ParkFilter{Consumer: "counter", Status: projection.ParkOpen})
	if err != nil {
		e.t.Fatal(err)
	}
	return parks
}

// parkModel returns n and v of stream id in the live counts table (0, 0 when
// it has no row).
func (e *env) parkModel(id string) (n, v int64) {
	e.t.Helper()
	err := e.store.Pool().QueryRow(e.ctx, `SELECT n, v FROM `+pgx.Identifier{e.schema, "counts"}.Sanitize()+` WHERE stream_id = $1`, id).Scan(&n, &v)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		e.t.Fatal(err)
	}
	return n, v
}

func (e *env) appendOne(id string, payload any) {
	e.t.Helper()
	if err := pgx.BeginFunc(e.ctx, e.store.Pool(), func(tx pgx.Tx) error {
		_, err := e.store.Append(e.ctx, tx, projector.Stream("ticket", id), projector.AnyVersion, payload)
		return err
	}); err != nil {
		e.t.Fatal(err)
	}
}

// A blue/green rebuild of a ParkStream projection whose new version still
// fails on a parked stream reaches its switch (its shadow parks the stream
// instead of halting), and the switch hands the park over: the old
// model's park is resolved, the live consumer holds the stream parked from
// the event the new version fails on, with every later event in order —
// those appended while the shadow built, across the switch and after it —
// while the other streams are applied. A retry after the switch applies
// the handed-over sequence once, in order, through the new version.
func TestBlueGreenSwitchHandsOverStillFailingParks(t *testing.T) {
	t.Parallel()
	testParkHandOver(t, newEnv(t), 1)
}

// The same for a partitioned consumer: the handed-over park goes to the
// partition whose segment holds its stream, whose passes then hold the
// stream's later events behind it.
func TestBlueGreenSwitchHandsOverParksToTheirPartition(t *testing.T) {
	t.Parallel()
	testParkHandOver(t, partitionedEnv(t), 2)
}

func testParkHandOver(t *testing.T, e *env, partitions int) {
	var stillFailing atomic.Bool
	var outOfOrder atomic.Int64
	stillFailing.Store(true)
	e.appendOne("p", testevents.TicketOpened{Title: "p"})
	e.appendOne("p", testevents.TicketCommented{Body: "1"})
	e.appendOne("ok", testevents.TicketOpened{Title: "ok"})
	startDispatcher(t, e.store, projection.Config{InstanceID: "v1"}, e.parkCounter(1, partitions, &stillFailing, &outOfOrder))
	eventually(t, 30*time.Second, "version 1 to park p", func() bool {
		parks := e.openParks()
		return len(parks) == 1 && parks[0].Events == 2
	})
	old := e.openParks()[0]

	// Writers append to p (one event at a time) and to streams of their
	// own while version 2 builds, and across its switch.
	stop := make(chan struct{})
	var pLast, others atomic.Int64
	pLast.Store(2)
	var wg sync.WaitGroup
	t.Cleanup(wg.Wait)
	wg.Go(func() {
		for i := range appendsPerWriter {
			select {
			case <-stop:
				return
			default:
			}
			err := pgx.BeginFunc(e.ctx, e.store.Pool(), func(tx pgx.Tx) error {
				if _, err := e.store.Append(e.ctx, tx, projector.Stream("ticket", "p"), projector.AnyVersion, testevents.TicketCommented{Body: "w"}); err != nil {
					return err
				}
				_, err := e.store.Append(e.ctx, tx, projector.Stream("ticket", fmt.Sprintf("o-%d", i)), projector.NoStream, testevents.TicketOpened{Title: "o"})
				return err
			})
			if err != nil {
				t.Errorf("append: %v", err)
				return
			}
			pLast.Add(1)
			others.Add(1)
		}
	})
	stopWriters := sync.OnceFunc(func() { close(stop); wg.Wait() })
	defer stopWriters()

	startDispatcher(t, e.store, projection.Config{InstanceID: "v2"}, e.parkCounter(2, partitions, &stillFailing, &outOfOrder))
	rb, err := rebuild.Request(e.ctx, e.store, "counter", rebuild.Options{})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 45*time.Second, "the rebuild to switch while its new version still fails on p", func() bool {
		r, err := rebuild.Current(e.ctx, e.store, "counter")
		return err == nil && r.Status == rebuild.Switched
	})
	atSwitch := pLast.Load()
	eventually(t, 30*time.Second, "appends to p after the switch", func() bool { return pLast.Load() >= atSwitch+3 || pLast.Load() == appendsPerWriter+2 })
	stopWriters()
	last := pLast.Load()

	// The live consumer catches up: p's events from v2 on held in one
	// open park of the live model, every other stream applied.
	eventually(t, 30*time.Second, "the live consumer to hold p's later events and apply the others", func() bool {
		parks := e.openParks()
		var sum int64
		_ = e.store.Pool().QueryRow(e.ctx, `SELECT coalesce(sum(n), 0) FROM `+pgx.Identifier{e.schema, "counts"}.Sanitize()+
			` WHERE starts_with(stream_id, 'o-')`).Scan(&sum)
		return len(parks) == 1 && int64(parks[0].Events) == last-1 && sum == others.Load()
	})
	pk := e.openParks()[0]
	if pk.Instance == projection.RebuildInstance || (partitions == 1) != (pk.Instance == projection.SharedInstance) ||
		(partitions > 1 && !strings.HasPrefix(pk.Instance, projection.PartitionPrefix)) {
		t.Fatalf("the handed-over park is on shard %s", pk.Instance)
	}
	if pk.StreamID != "p" || pk.Version != 2 || !strings.Contains(pk.Error, "v2 cannot handle p v2") {
		t.Fatalf("handed-over park: %+v, want p parked at v2 with version 2's error", pk)
	}
	_, events, err := projection.GetPark(e.ctx, e.store, pk.ID)
	if err != nil {
		t.Fatal(err)
	}
	for i, ev := range events {
		if ev.Version != int64(i)+2 {
			t.Fatalf("parked sequence: event %d is v%d, want v%d (in order, none missing)", i, ev.Version, i+2)
		}
	}
	gone, _, err := projection.GetPark(e.ctx, e.store, old.ID)
	want := fmt.Sprintf("rebuild %d (replayed by the switch; still failing: handed over as park %d)", rb.ID, pk.ID)
	if err != nil || gone.Status != projection.ParkResolved || gone.ResolvedBy != want {
		t.Fatalf("version 1's park after the switch: %+v, %v; want resolved by %q", gone, err, want)
	}
	if n, v := e.parkModel("p"); n != 1 || v != 1 {
		t.Fatalf("p in the new model: n %d, v %d; want only v1 applied", n, v)
	}
	if n, _ := e.parkModel("ok"); n != 1 {
		t.Fatalf("ok counted %d times, want 1", n)
	}

	// A retry that fails again keeps the park; one through the fixed
	// handler applies the whole sequence once, in order.
	if res, err := projection.RetryPark(e.ctx, e.store, e.parkCounter(2, partitions, &stillFailing, &outOfOrder), pk.ID, "tester", nil); err != nil || res.Resolved {
		t.Fatalf("retry while still failing: %+v, %v", res, err)
	}
	stillFailing.Store(false)
	v2 := e.parkCounter(2, partitions, &stillFailing, &outOfOrder)
	if res, err := projection.RetryPark(e.ctx, e.store, v2, pk.ID, "tester", nil); err != nil || !res.Resolved || int64(res.Events) != last-1 {
		t.Fatalf("retry: %+v, %v; want %d events resolved", res, err, last-1)
	}
	if n, v := e.parkModel("p"); n != last || v != last {
		t.Fatalf("p after the retry: n %d, v %d; want %d, %d", n, v, last, last)
	}
	if _, err := projection.RetryPark(e.ctx, e.store, v2, pk.ID, "tester", nil); !errors.Is(err, projector.ErrInvalidTransition) {
		t.Fatalf("second retry: %v, want a refusal", err)
	}
	e.appendOne("p", testevents.TicketCommented{Body: "after"})
	eventually(t, 30*time.Second, "p live again", func() bool { n, _ := e.parkModel("p"); return n == last+1 })
	if got := outOfOrder.Load(); got != 0 {
		t.Fatalf("%d events applied out of order or twice", got)
	}
	if parks := e.openParks(); len(parks) != 0 {
		t.Fatalf("open parks left: %+v", parks)
	}
}

// A park of a rebuild's shadow shard belongs to a model not yet live: a
// retry (or a retry request) is refused with ErrParkNotLive, and cancelling
// the rebuild discards it for the record, leaving the live model's park of
// the same stream open.
func TestShadowParksAreNotLiveUntilTheSwitch(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var stillFailing atomic.Bool
	var outOfOrder atomic.Int64
	stillFailing.Store(true)
	e.appendOne("p", testevents.TicketOpened{Title: "p"})
	e.appendOne("p", testevents.TicketCommented{Body: "1"})
	startDispatcher(t, e.store, projection.Config{InstanceID: "v1"}, e.parkCounter(1, 1, &stillFailing, &outOfOrder))
	eventually(t, 30*time.Second, "version 1 to park p", func() bool { return len(e.openParks()) == 1 })
	live := e.openParks()[0]
	v2 := e.parkCounter(2, 1, &stillFailing, &outOfOrder)
	startDispatcher(t, e.store, projection.Config{InstanceID: "v2"}, v2)
	rb, err := rebuild.Request(e.ctx, e.store, "counter", rebuild.Options{Hold: true})
	if err != nil {
		t.Fatal(err)
	}
	// Ready means caught up with the live cursor, which may still stand
	// before p v2 (a horizon held back by another transaction kept it from
	// version 1's pass that parked p): the shadow parks p v2 once the live
	// consumer has read it.
	var shadow projection.Park
	eventually(t, 45*time.Second, "the held rebuild to be ready with p parked on its shadow", func() bool {
		r, err := rebuild.Current(e.ctx, e.store, "counter")
		if err != nil || r.Status != rebuild.Ready {
			return false
		}
		for _, pk := range e.openParks() {
			if pk.Instance == projection.RebuildInstance {
				shadow = pk
			}
		}
		return shadow.ID != 0
	})
	if shadow.ID == 0 || shadow.StreamID != "p" || shadow.Version != 2 || shadow.Events != 1 {
		t.Fatalf("shadow park: %+v; want p parked at v2 by the shadow shard", shadow)
	}
	if _, err := projection.RetryPark(e.ctx, e.store, v2, shadow.ID, "tester", nil); !errors.Is(err, projection.ErrParkNotLive) {
		t.Fatalf("retry of the shadow's park: %v, want ErrParkNotLive", err)
	}
	if err := projection.RequestParkRetry(e.ctx, e.store, shadow.ID, "tester"); !errors.Is(err, projection.ErrParkNotLive) {
		t.Fatalf("retry request on the shadow's park: %v, want ErrParkNotLive", err)
	}
	if err := rebuild.Cancel(e.ctx, e.store, "counter"); err != nil {
		t.Fatal(err)
	}
	got, _, err := projection.GetPark(e.ctx, e.store, shadow.ID)
	if want := fmt.Sprintf("rebuild %d (cancelled: its model never went live)", rb.ID); err != nil ||
		got.Status != projection.ParkDiscarded || got.ResolvedBy != want || got.Events != 1 {
		t.Fatalf("shadow park after the cancel: %+v, %v; want discarded by %q", got, err, want)
	}
	if parks := e.openParks(); len(parks) != 1 || parks[0].ID != live.ID {
		t.Fatalf("open parks after the cancel: %+v; want only the live model's", parks)
	}
}
