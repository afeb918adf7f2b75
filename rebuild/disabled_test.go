package rebuild_test

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/rebuild"
)

// disabledCounter is an env whose counter (version 1) counted 20 events and
// was then disabled by an operator, its dispatcher still running.
func disabledCounter(t *testing.T) *env {
	t.Helper()
	e := newEnv(t)
	d := e.dispatcher(e.counter(1, projection.AsyncConfig{}))
	for i := range 10 {
		e.appendBatch(t, i, 2)
	}
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	if err := d.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	if err := projection.NewAdmin(e.store).Disable(e.ctx, projection.ShardID{Consumer: "counter"}); err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *env) liveStatus() projection.Status {
	e.t.Helper()
	st, err := projection.NewAdmin(e.store).Status(e.ctx, projection.ShardID{Consumer: "counter"})
	if err != nil {
		e.t.Fatal(err)
	}
	return st.Status
}

// An in-place rebuild of a disabled consumer would clear its tables for a
// replay no dispatcher runs: refused up front (ErrDisabled, an
// ErrNotRebuildable), the model and the consumer untouched.
func TestInPlaceRebuildOfDisabledConsumerRefused(t *testing.T) {
	t.Parallel()
	e := disabledCounter(t)
	_, err := rebuild.Request(e.ctx, e.store, "counter", rebuild.Options{Mode: rebuild.InPlace})
	if !errors.Is(err, rebuild.ErrDisabled) || !errors.Is(err, rebuild.ErrNotRebuildable) {
		r, _ := e.read()
		t.Fatalf("in-place rebuild of a disabled consumer: %v, want ErrDisabled; the model now counts %d events", err, r.counted)
	}
	t.Log(err)
	if r, err := e.read(); err != nil || r.counted != 20 {
		t.Fatalf("the refused rebuild changed the model: %+v, %v", r, err)
	}
	if rs, err := rebuild.List(e.ctx, e.store, "counter"); err != nil || len(rs) != 0 {
		t.Fatalf("the refused rebuild left rebuilds: %+v, %v", rs, err)
	}
	if s := e.liveStatus(); s != projection.StatusDisabled {
		t.Fatalf("the consumer is %s after the refusal, want disabled", s)
	}
}

// A blue/green switch keeps a disabled live shard disabled: the operator
// disabled it, and only `consumer enable` lets dispatchers run it again.
func TestBlueGreenSwitchKeepsDisabledConsumerDisabled(t *testing.T) {
	t.Parallel()
	e := disabledCounter(t)
	e.dispatcher(e.counter(2, projection.AsyncConfig{}))
	if _, err := rebuild.Request(e.ctx, e.store, "counter", rebuild.Options{}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	final, err := rebuild.Wait(ctx, e.store, "counter", 10*time.Millisecond, nil)
	if err != nil || final.Status != rebuild.Switched {
		t.Fatalf("rebuild ended %+v, %v", final, err)
	}
	if s := e.liveStatus(); s != projection.StatusDisabled {
		t.Fatalf("the live consumer is %s after the switch, want disabled", s)
	}
	if r, err := e.read(); err != nil || r.counted != 20 || len(r.versions) != 1 || r.versions[0] != 2 {
		t.Fatalf("after the switch: %+v, %v", r, err)
	}
}

// A version PostgreSQL cannot store is a clear ErrUnknownProjection, not
// a driver error.
func TestRequestVersionOutOfRange(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.dispatcher(e.counter(1, projection.AsyncConfig{}))
	for _, v := range []int{-1, math.MaxInt32 + 1, 99999999999} {
		if _, err := rebuild.Request(e.ctx, e.store, "counter", rebuild.Options{Version: v}); !errors.Is(err, rebuild.ErrUnknownProjection) {
			t.Errorf("version %d: %v, want ErrUnknownProjection", v, err)
		}
	}
}
