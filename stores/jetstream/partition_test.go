package jetstream_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/projectorhq/projector/cli"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	pjs "github.com/projectorhq/projector/stores/jetstream"
)

// A relay with four partitions, run by two dispatchers (each its own relay
// and NATS connection, as two processes) while two writers append: the
// stream holds every event once, each stream's versions in order on its
// subject, and both dispatchers published.
func TestRelayPartitionsPublishOnceInOrder(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	if err := e.store.CreatePartitionIndex(e.ctx); err != nil {
		t.Fatal(err)
	}
	cfg := e.relayConfig()
	cfg.Async.Partitions, cfg.Async.BatchSize = 4, 10
	var ds []*projection.Dispatcher
	for i := range 2 {
		c := cfg
		c.Conn = connect(t, e.url)
		ds = append(ds, e.dispatcherAs(fmt.Sprintf("relay-%d", i+1), e.relay(c).Async()))
	}
	var wg sync.WaitGroup
	for w := range 2 {
		wg.Go(func() {
			for i := range 60 {
				if err := e.appendErr("acme", fmt.Sprintf("w%d-%d", w, i%15), testevents.TicketCommented{Body: "x", N: i}); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	want := uint64(len(e.logEvents()))
	waitFor(t, "every event published", 60*time.Second, func() bool { return e.msgCount(e.nc) >= want })
	for _, d := range ds {
		if err := d.CatchUp(e.ctx); err != nil {
			t.Fatal(err)
		}
	}
	e.checkOnceInOrder(e.streamMsgs(e.nc))
	owners := map[string]int{}
	states, err := projection.NewAdmin(e.store).List(e.ctx, pjs.DefaultRelayName)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range states {
		if s.Partitions > 0 && s.Processed > 0 {
			owners[s.Owner]++
		}
	}
	if owners["relay-1"] == 0 || owners["relay-2"] == 0 {
		t.Errorf("partitions that published, by owner: %v; want both dispatchers", owners)
	}

	// relay status shows the partitions (cursor, lag, owner), not only
	// the unpartitioned row, which is their fence.
	run := func(args ...string) string {
		root := cli.New(cli.Config{Registry: e.types.Registry})
		var out bytes.Buffer
		root.SetArgs(append([]string{"relay", "status", "--nats-url", e.url, "--stream", e.stream,
			"--database-url", pgtest.URL(t), "--schema", e.store.Schema()}, args...))
		root.SetOut(&out)
		root.SetErr(&out)
		if err := root.ExecuteContext(e.ctx); err != nil {
			t.Fatalf("relay status %v: %v\n%s", args, err, out.String())
		}
		return out.String()
	}
	var st pjs.Status
	if out := run("-o", "json"); json.Unmarshal([]byte(out), &st) != nil || len(st.Partitions) != 4 {
		t.Fatalf("relay status -o json: %d partitions, want 4:\n%s", len(st.Partitions), out)
	}
	for _, p := range st.Partitions {
		if p.LagEvents != 0 || p.Owner == "" {
			t.Errorf("partition %d: lag %d, owner %q", p.Partition, p.LagEvents, p.Owner)
		}
	}
	out := run()
	// The fence is stored disabled; it shows as the partitioned relay.
	for _, want := range []string{"partition 0/4", "partition 3/4", "owner relay-", "status            partitioned (4)"} {
		if !strings.Contains(out, want) {
			t.Errorf("relay status lacks %q:\n%s", want, out)
		}
	}
}

// The tail check of TestRelaySkipsEventsStoredPastItsCursorAfterTheDuplicateWindow
// with four partitions standing at different positions: each partition
// knows the events stored past its own cursor (its own streams' messages
// in the stream, read back to its own cursor), so after a downtime longer
// than the window the stream still holds each event once.
func TestRelayPartitionsSkipStoredPastTheirCursors(t *testing.T) {
	srv := startNATS(t)
	e := newEnvAt(t, srv.url())
	if err := e.store.CreatePartitionIndex(e.ctx); err != nil {
		t.Fatal(err)
	}
	const n = 120
	for i := range n {
		e.append("acme", fmt.Sprintf("w%d", i%24), testevents.TicketCommented{Body: "x", N: i})
	}
	cfg := e.relayConfig()
	cfg.DuplicateWindow = time.Second
	cfg.PublishTimeout = 300 * time.Millisecond
	cfg.Async.BatchTimeout = 300 * time.Millisecond
	cfg.Async.BatchSize = 4
	cfg.Async.Partitions = 4

	first := e.relay(cfg)
	catchUpOnce(t, e, first)
	if got := e.msgCount(e.nc); got != n {
		t.Fatalf("%d messages after the first relay, want %d", got, n)
	}
	// Every partition goes back: two to the start, two to the middle of
	// the log, as if each had crashed after its acknowledgements.
	mid := e.logEvents()[n/2].Position
	for p := range 4 {
		cursor := "0"
		seq := int64(0)
		if p%2 == 1 {
			cursor, seq = fmt.Sprint(mid.TxID), mid.Seq
		}
		if _, err := e.store.Pool().Exec(e.ctx, `UPDATE `+e.store.Table("projector_consumers")+
			` SET cursor_tx_id = $2::xid8, cursor_seq = $3 WHERE name = $1 AND instance_id = $4`,
			pjs.DefaultRelayName, cursor, seq, projection.PartitionInstance(p, 4)); err != nil {
			t.Fatal(err)
		}
	}
	waitForDuplicateWindow(t, e)

	second := e.relay(cfg)
	catchUpOnce(t, e, second)
	e.checkOnceInOrder(e.streamMsgs(e.nc))
}
