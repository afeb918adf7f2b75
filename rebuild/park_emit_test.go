package rebuild_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
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

// emitter is a ParkStream projection (MaxAttempts 1) that emits one event
// per event it applies, to stream "echo"/"<stream>-<version>", so the log
// shows how often each event's Emit appended. Version 1 fails on stream
// q from its v3 on and on r from its v2 on (it ignores the echoes); version 2 fails on p and q from their v2 on while
// stillFailing is set.
func (e *env) emitter(version, partitions int, stillFailing *atomic.Bool) *projection.Async {
	p := projection.NewAsync("counter", projection.AsyncConfig{Version: version, Tables: []string{e.table}, Partitions: partitions,
		ErrorMode: projection.ParkStream, MaxAttempts: 1})
	h := func(ctx context.Context, tx pgx.Tx, ev projector.Event) error {
		id := ev.Stream.ID
		if ev.Stream.Type == "echo" {
			return nil // its own emitted events
		}
		if (version == 1 && ((id == "q" && ev.Version >= 3) || (id == "r" && ev.Version >= 2))) ||
			(version == 2 && stillFailing.Load() && (id == "p" || id == "q") && ev.Version >= 2) {
			return fmt.Errorf("v%d cannot handle %s v%d", version, id, ev.Version)
		}
		_, err := projection.Emit(ctx, tx, projector.Stream("echo", fmt.Sprintf("%s-%d", id, ev.Version)), projector.AnyVersion,
			testevents.TicketCommented{Body: "echo"})
		return err
	}
	must(projection.OnEvent(p, e.types.Opened, h))
	must(projection.OnEvent(p, e.types.Commented, h))
	return p
}

// echoes returns how many events each echo stream holds.
func (e *env) echoes() map[string]int {
	e.t.Helper()
	rows, err := e.store.Pool().Query(e.ctx, `SELECT stream_id, count(*)::int FROM `+e.store.Table("projector_events")+`
		WHERE stream_type = 'echo' GROUP BY stream_id`)
	if err != nil {
		e.t.Fatal(err)
	}
	out := map[string]int{}
	var id string
	var n int
	if _, err := pgx.ForEachRow(rows, []any{&id, &n}, func() error { out[id] = n; return nil }); err != nil {
		e.t.Fatal(err)
	}
	return out
}

// A retry of a park a blue/green switch handed over gives the handlers the
// events the model before the rebuild had applied live as replays, and
// the rest as live, so each event's Emit appends once over the life of the
// consumer. Stream p: version 1 applied v1 and v2 live (and emitted); the
// new version parks it at v2 in the shadow. Stream q: version 1 applied v1
// and v2 and parked v3; the new version parks it at v2. After the switch
// each stream gets one more event, held behind its park; the retries
// through the fixed version emit v3 of p and v3 to v5 of q, nothing twice.
// Stream r shows what is not handled (docs/rebuilds.md): version 1 parked
// it at v2, the new version applies v2 in the shadow as a replay, so r v2
// is never emitted, and the switch says so in its log.
func TestBlueGreenHandedOverParkRetryEmitsOnce(t *testing.T) {
	t.Parallel()
	testHandedOverParkEmits(t, newEnv(t), 1)
}

// The same for a partitioned consumer, whose live shards each had a cursor
// of their own.
func TestBlueGreenHandedOverParkRetryEmitsOncePartitioned(t *testing.T) {
	t.Parallel()
	testHandedOverParkEmits(t, partitionedEnv(t), 2)
}

func testHandedOverParkEmits(t *testing.T, e *env, partitions int) {
	var stillFailing atomic.Bool
	stillFailing.Store(true)
	for _, id := range []string{"p", "q", "r", "ok"} {
		e.appendOne(id, testevents.TicketOpened{Title: id})
	}
	e.appendOne("p", testevents.TicketCommented{Body: "2"})
	e.appendOne("r", testevents.TicketCommented{Body: "2"})
	for i := 2; i <= 4; i++ {
		e.appendOne("q", testevents.TicketCommented{Body: fmt.Sprint(i)})
	}
	startDispatcher(t, e.store, projection.Config{InstanceID: "v1"}, e.emitter(1, partitions, &stillFailing))
	eventually(t, 30*time.Second, "version 1 to apply p, ok, q up to v2 and r v1, and park q at v3 and r at v2", func() bool {
		parks := e.openParks()
		return len(parks) == 2 && parks[0].Events+parks[1].Events == 3 && len(e.echoes()) == 6
	})

	var logs lockedBuffer
	startDispatcher(t, e.store, projection.Config{InstanceID: "v2", Logger: slog.New(slog.NewTextHandler(&logs, nil))},
		e.emitter(2, partitions, &stillFailing))
	if _, err := rebuild.Request(e.ctx, e.store, "counter", rebuild.Options{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 45*time.Second, "the rebuild to switch with p and q parked by its new version", func() bool {
		r, err := rebuild.Current(e.ctx, e.store, "counter")
		return err == nil && r.Status == rebuild.Switched
	})
	e.appendOne("p", testevents.TicketCommented{Body: "3"})
	e.appendOne("q", testevents.TicketCommented{Body: "5"})
	eventually(t, 30*time.Second, "the live consumer to hold p v2-v3 and q v2-v5", func() bool {
		parks := e.openParks()
		return len(parks) == 2 && parks[0].Instance != projection.RebuildInstance && parks[0].Events+parks[1].Events == 6
	})
	for _, pk := range e.openParks() {
		if pk.Version != 2 || pk.LiveThrough != 2 {
			t.Fatalf("handed-over park of %s at v%d with live mark v%d; want v2 and v2 (version 1 applied v2 live)", pk.StreamID, pk.Version, pk.LiveThrough)
		}
	}
	stillFailing.Store(false)
	v2 := e.emitter(2, partitions, &stillFailing)
	for _, pk := range e.openParks() {
		if res, err := projection.RetryPark(e.ctx, e.store, v2, pk.ID, "tester", nil); err != nil || !res.Resolved {
			t.Fatalf("retry of %+v: %+v, %v", pk, res, err)
		}
	}
	got := e.echoes()
	want := map[string]int{"ok-1": 1, "r-1": 1, "p-1": 1, "p-2": 1, "p-3": 1, "q-1": 1, "q-2": 1, "q-3": 1, "q-4": 1, "q-5": 1}
	if !maps.Equal(got, want) {
		keys := slices.Sorted(maps.Keys(got))
		t.Fatalf("emitted per event %v (%v); want each event's Emit appended once: %v", got, keys, want)
	}
	if l := logs.String(); !strings.Contains(l, "appended nothing") || !strings.Contains(l, "events=1 parks=1") {
		t.Fatalf("the switch's log does not count r v2 as applied without its Emit:\n%s", l)
	}
}

// lockedBuffer is a log sink the dispatcher's goroutines write to while the
// test reads it.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
