package cli

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/rebuild"
)

// While a blue/green rebuild builds, `status` shows its shadow shard as the
// rebuild's (not idle), run by the live dispatcher that builds it (not
// none).
func TestStatusShowsShadowShardBuilding(t *testing.T) {
	t.Parallel()
	e := newRebuildEnv(t, 5)
	e.dispatcher(e.counter(2))
	if _, err := rebuild.Request(e.ctx, e.store, "counter", rebuild.Options{Hold: true}); err != nil {
		t.Fatal(err)
	}
	pgtest.Eventually(t, time.Minute, "the held rebuild to be ready", func() bool {
		r, err := rebuild.Current(e.ctx, e.store, "counter")
		return err == nil && r.Status == rebuild.Ready
	})
	r := e.run(nil, "status")
	r.want(t, ExitOK)
	var shadow string
	for line := range strings.Lines(r.out.String()) {
		if strings.Contains(line, projection.RebuildInstance) && strings.HasPrefix(line, "counter") {
			shadow = line
		}
	}
	if shadow == "" {
		t.Fatalf("no shadow shard in status:\n%s", r.out.String())
	}
	for _, bad := range []string{" idle ", " none"} {
		if strings.Contains(shadow, bad) {
			t.Errorf("the shadow shard's line has %q:\n%s", bad, shadow)
		}
	}
	for _, want := range []string{"ready", "live"} {
		if !strings.Contains(shadow, want) {
			t.Errorf("the shadow shard's line lacks %q:\n%s", want, shadow)
		}
	}
}

// `rebuild cancel` says what it waits for while a shadow batch holds the
// shadow shard's lock, and cancels once the batch ends.
func TestRebuildCancelSaysWhatItWaitsFor(t *testing.T) {
	t.Parallel()
	e := newRebuildEnv(t, 5)
	if _, err := rebuild.Request(e.ctx, e.store, "counter", rebuild.Options{Hold: true}); err != nil {
		t.Fatal(err)
	}
	batch, err := e.store.Pool().Begin(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = batch.Rollback(context.Background()) }()
	if err := projection.LockShard(e.ctx, batch, e.store, projection.ShardID{Consumer: "counter", Instance: projection.RebuildInstance}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(e.ctx, 2*time.Minute)
	defer cancel()
	r := e.start(ctx, nil, "rebuild", "cancel", "counter")
	r.waitFor(t, "waiting for the shadow's running batch")
	if err := batch.Rollback(e.ctx); err != nil {
		t.Fatal(err)
	}
	<-r.done
	r.want(t, ExitOK, "rebuild of counter: cancel done")
}
