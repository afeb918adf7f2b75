package projection_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

// A hot partition shows in the metrics: each partition's rate of arriving
// events and its skew, published with the other gauges.
func TestPartitionLoadGauges(t *testing.T) {
	t.Parallel()
	e := partitioned(t)
	hot := make([]any, 300)
	for i := range hot {
		hot[i] = testevents.TicketCommented{Body: "busy"}
	}
	if err := pgx.BeginFunc(e.ctx, e.store.Pool(), func(tx pgx.Tx) error {
		if _, err := e.store.Append(e.ctx, tx, projector.Stream("ticket", "hot"), projector.NoStream, hot...); err != nil {
			return err
		}
		for i := range 40 {
			if _, err := e.store.Append(e.ctx, tx, projector.Stream("ticket", "calm-"+strconv.Itoa(i)), projector.NoStream,
				testevents.TicketOpened{Title: "t"}, testevents.TicketCommented{Body: "c"}); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	hotPart := int(postgres.StreamHash(projector.SystemTenant, "ticket", "hot") >> 30)
	reg := prometheus.NewRegistry()
	p := counting(e.schema, e.types, "loaded", projection.AsyncConfig{Partitions: 4})
	e.dispatcher(projection.Config{Projections: []*projection.Async{p}, Registerer: reg, MetricsEvery: 20 * time.Millisecond})
	gauge := func(name string, partition int) (float64, bool) {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() != name {
				continue
			}
			for _, m := range mf.GetMetric() {
				if hasLabel(m, "consumer", "loaded") && hasLabel(m, "instance_id", projection.PartitionInstance(partition, 4)) {
					return m.Gauge.GetValue(), true
				}
			}
		}
		return 0, false
	}
	eventually(t, time.Minute, "the load gauges published", func() bool {
		_, ok := gauge("projector_partition_skew", 3)
		return ok
	})
	for part := range 4 {
		skew, _ := gauge("projector_partition_skew", part)
		rate, ok := gauge("projector_partition_in_events_per_second", part)
		if !ok || rate <= 0 {
			t.Errorf("partition %d: in rate %v (published %v)", part, rate, ok)
		}
		if (skew >= projection.HotSkew) != (part == hotPart) {
			t.Errorf("partition %d: skew %.2f; the hot stream is in partition %d", part, skew, hotPart)
		}
	}
}

// A consumer partitioned by key (as sagas are) places events by their key,
// not their stream: the load by stream hash says nothing of its
// partitions, so none is measured (no rate, no skew, never HOT), however
// hot a stream is.
func TestKeyedPartitionsShowNoStreamLoad(t *testing.T) {
	t.Parallel()
	e := partitioned(t)
	if err := pgx.BeginFunc(e.ctx, e.store.Pool(), func(tx pgx.Tx) error {
		hot := make([]any, 300)
		for i := range hot {
			hot[i] = testevents.TicketCommented{Body: "busy"}
		}
		_, err := e.store.Append(e.ctx, tx, projector.Stream("ticket", "hot"), projector.NoStream, hot...)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	p := counting(e.schema, e.types, "bykey", projection.AsyncConfig{Partitions: 4,
		PartitionKey: func(ev projector.Event) (string, error) { return ev.Stream.ID, nil }})
	e.dispatcher(projection.Config{Projections: []*projection.Async{p}})
	shards, err := projection.NewAdmin(e.store).List(e.ctx, "bykey")
	if err != nil {
		t.Fatal(err)
	}
	parts := 0
	for _, s := range shards {
		if s.Partitions == 0 {
			continue
		}
		parts++
		if s.InRate != 0 || s.Skew != 0 || s.Hot() {
			t.Errorf("keyed partition %d/%d: in %.1f/s, skew %.2f, hot %v; want none measured", s.Partition, s.Partitions, s.InRate, s.Skew, s.Hot())
		}
	}
	if parts != 4 {
		t.Fatalf("%d partitions listed, want 4", parts)
	}
}
