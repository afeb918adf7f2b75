package rebuild_test

import (
	"context"
	"testing"
	"time"

	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/rebuild"
)

// The DISPATCHER column of a blue/green rebuild's shadow says live only
// while a process of the new version runs it (docs/operations.md): with
// version 1's processes alone it said live, though none of them applies
// a shadow of version 2. And once version 2 switched in, the live shard is
// live only while a version-2 process runs (a version-1 one stands aside).
func TestShadowDispatcherLiveOnlyWithItsVersion(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.appendTickets("s", 10)
	startDispatcher(t, e.store, projection.Config{InstanceID: "v1"}, e.counter(1, projection.AsyncConfig{}))
	eventually(t, time.Minute, "version 1 to serve every stream", func() bool {
		diff, _, err := e.freshDiff()
		return err == nil && diff == 0
	})
	stop := func(d *projection.Dispatcher) {
		t.Helper()
		ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
		defer cancel()
		if err := d.Stop(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// A rebuild needs version 2 registered by a process: one ran, and stopped.
	stop(startDispatcher(t, e.store, projection.Config{InstanceID: "v2"}, e.counter(2, projection.AsyncConfig{})))
	if _, err := rebuild.Request(e.ctx, e.store, "counter", rebuild.Options{Version: 2, Hold: true}); err != nil {
		t.Fatal(err)
	}
	state := func(instance string) projection.DispatcherState {
		t.Helper()
		shards, err := projection.NewAdmin(e.store).List(e.ctx, "counter")
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range shards {
			if s.Instance == instance {
				return s.Dispatcher
			}
		}
		t.Fatalf("no shard %s in %+v", instance, shards)
		return ""
	}
	if got := state(projection.RebuildInstance); got != projection.DispatcherNone {
		t.Errorf("shadow of version 2 with only version 1 running: dispatcher %q, want none", got)
	}
	if got := state(projection.SharedInstance); got != projection.DispatcherLive {
		t.Errorf("live shard of version 1 with version 1 running: dispatcher %q, want live", got)
	}

	// A process of an earlier release lists the name alone: taken at its
	// name, as before.
	e.exec(`INSERT INTO ` + e.store.Table("projector_instances") + ` (instance_id, random_id, consumers, heartbeat_every, expire_after)
		VALUES ('old-release', false, '{counter}', '10 seconds', '1 day')`)
	if got := state(projection.RebuildInstance); got != projection.DispatcherLive {
		t.Errorf("shadow with a process of an earlier release running: dispatcher %q, want live", got)
	}
	e.exec(`DELETE FROM ` + e.store.Table("projector_instances") + ` WHERE instance_id = 'old-release'`)

	v2 := startDispatcher(t, e.store, projection.Config{InstanceID: "v2"}, e.counter(2, projection.AsyncConfig{}))
	eventually(t, time.Minute, "the shadow of version 2 shown live", func() bool {
		return state(projection.RebuildInstance) == projection.DispatcherLive
	})
	if err := rebuild.Switch(e.ctx, e.store, "counter"); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "version 2 to switch in", func() bool {
		_, versions, err := e.freshDiff()
		return err == nil && len(versions) == 1 && versions[0] == 2
	})
	if got := state(projection.SharedInstance); got != projection.DispatcherLive {
		t.Errorf("live shard of version 2 with version 2 running: dispatcher %q, want live", got)
	}
	stop(v2)
	if got := state(projection.SharedInstance); got != projection.DispatcherNone {
		t.Errorf("live shard of version 2 with only version 1 running: dispatcher %q, want none", got)
	}
}
