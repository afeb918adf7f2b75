package projection_test

import (
	"context"
	"testing"
	"time"

	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/projection"
)

func TestDispatcherAppliesEverything(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	versions := e.appendMany(4, 3000, 60)
	p := counting(e.schema, e.types, "counting", projection.AsyncConfig{BatchSize: 100})
	d := e.dispatcher(projection.Config{Projections: []*projection.Async{p}})
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	if err := d.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	e.checkCounts("counting", versions)

	// Events appended while it runs arrive too.
	more := appendWith(t, e.ctx, e.store, 2, 500, 10, "late")
	if err := d.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	got, _ := e.counts("counting")
	for id, v := range more {
		if got[id] != v {
			t.Errorf("late stream %s: %d applied, want %d", id, got[id], v)
		}
	}
	_ = pgtest.URL
}
