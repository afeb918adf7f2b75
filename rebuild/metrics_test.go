package rebuild_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/rebuild"
)

// The dispatcher publishes a rebuild's progress: a version 2 whose handler
// fails on the 11th of 20 events builds its shadow up to there and stops
// (dead), so the gauges must say exactly half, 10 events to go, 20 in all;
// after the rebuild is cancelled its series are gone. An in-place rebuild
// to the same version stops at the same event on the live shard, and its
// gauges say so too.
func TestRebuildProgressGauges(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for i := range 10 {
		if err := pgx.BeginFunc(e.ctx, e.store.Pool(), func(tx pgx.Tx) error {
			_, err := e.store.Append(e.ctx, tx, projector.Stream("ticket", fmt.Sprintf("s-%02d", i)), projector.NoStream,
				testevents.TicketOpened{Title: "t"}, testevents.TicketCommented{Body: "c"})
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	d1 := e.dispatcher(e.counter(1, projection.AsyncConfig{}))
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	if err := d1.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}

	// Version 2 fails on stream s-05's first event, the 11th in the log; one
	// event a batch, so the shadow cursor stops right before it.
	v2 := projection.NewAsync("counter", projection.AsyncConfig{Version: 2, Tables: []string{e.table}, BatchSize: 1,
		MaxAttempts: 1, RetryBackoff: time.Millisecond})
	must(projection.OnEvent(v2, e.types.Opened, func(ctx context.Context, tx pgx.Tx, ev projector.Event) error {
		if ev.Stream.ID == "s-05" {
			return errors.New("version 2 cannot handle s-05")
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+projection.Table(ctx, e.table)+` (stream_id, n, v) VALUES ($1, 1, 2)
			ON CONFLICT (stream_id) DO UPDATE SET n = `+projection.Table(ctx, e.table)+`.n + 1`, ev.Stream.ID)
		return err
	}))
	must(projection.OnEvent(v2, e.types.Commented, func(ctx context.Context, tx pgx.Tx, ev projector.Event) error {
		_, err := tx.Exec(ctx, `UPDATE `+projection.Table(ctx, e.table)+` SET n = n + 1 WHERE stream_id = $1`, ev.Stream.ID)
		return err
	}))
	reg := prometheus.NewRegistry()
	d2, err := projection.New(projection.Config{Store: e.store, Projections: []*projection.Async{v2}, Registerer: reg,
		MetricsEvery: 20 * time.Millisecond, PollMax: 20 * time.Millisecond, Recheck: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := d2.Start(e.ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = d2.Stop(ctx)
	})

	labels := map[string]string{"consumer": "counter", "version": "2"}
	gauge := func(name string) (float64, bool) {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() != name {
				continue
			}
			for _, m := range mf.GetMetric() {
				if labelsAre(m, labels) {
					return m.GetGauge().GetValue(), true
				}
			}
		}
		return 0, false
	}
	// Nothing to report before a rebuild is requested.
	eventually(t, time.Minute, "a first metrics refresh", func() bool {
		_, ok := gaugeAny(t, reg, "projector_horizon_age_seconds")
		return ok
	})
	if v, ok := gauge("projector_rebuild_progress"); ok {
		t.Fatalf("progress %v published before any rebuild", v)
	}

	if _, err := rebuild.Request(e.ctx, e.store, "counter", rebuild.Options{Version: 2}); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "the shadow shard to die on s-05", func() bool {
		st, err := projection.NewAdmin(e.store).Status(e.ctx, projection.ShardID{Consumer: "counter", Instance: projection.RebuildInstance})
		return err == nil && st.Status == projection.StatusDead
	})
	eventually(t, time.Minute, "the gauges to show the dead shadow's progress", func() bool {
		p, ok1 := gauge("projector_rebuild_progress")
		r, ok2 := gauge("projector_rebuild_remaining_events")
		n, ok3 := gauge("projector_rebuild_target_events")
		return ok1 && ok2 && ok3 && p == 0.5 && r == 10 && n == 20
	})
	// The CLI and the gauge agree.
	if rb, err := rebuild.Current(e.ctx, e.store, "counter"); err != nil || rb.Progress() != 0.5 || rb.Remaining != 10 {
		t.Fatalf("rebuild.Current: %+v, %v; want progress 0.5, 10 remaining", rb, err)
	}

	if err := rebuild.Cancel(e.ctx, e.store, "counter"); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "the cancelled rebuild's series to go", func() bool {
		_, ok1 := gauge("projector_rebuild_progress")
		_, ok2 := gauge("projector_rebuild_remaining_events")
		_, ok3 := gauge("projector_rebuild_target_events")
		return !ok1 && !ok2 && !ok3
	})

	// In place, version 2 takes the live shard over at once and stops at the
	// same event: the gauges follow the live cursor.
	if _, err := rebuild.Request(e.ctx, e.store, "counter", rebuild.Options{Mode: rebuild.InPlace, Version: 2}); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "the live shard to die on s-05", func() bool {
		st, err := projection.NewAdmin(e.store).Status(e.ctx, projection.ShardID{Consumer: "counter"})
		return err == nil && st.Status == projection.StatusDead
	})
	eventually(t, time.Minute, "the gauges to show the in-place rebuild's progress", func() bool {
		p, ok1 := gauge("projector_rebuild_progress")
		r, ok2 := gauge("projector_rebuild_remaining_events")
		return ok1 && ok2 && p == 0.5 && r == 10
	})
}

// gaugeAny reports whether reg has a series of the metric name.
func gaugeAny(t *testing.T, reg *prometheus.Registry, name string) (float64, bool) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) > 0 {
			return mf.GetMetric()[0].GetGauge().GetValue(), true
		}
	}
	return 0, false
}

func labelsAre(m *dto.Metric, want map[string]string) bool {
	for k, v := range want {
		found := false
		for _, l := range m.GetLabel() {
			if l.GetName() == k && l.GetValue() == v {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}
