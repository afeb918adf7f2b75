package cli

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/rebuild"
)

// status shows a blue/green rebuild's shadow shard as what it is and the
// rebuild's percentage; an in-place rebuild is shown on the live shard.
func TestStatusShowsRebuilds(t *testing.T) {
	now := time.Now()
	shards := []projection.ShardState{
		{ShardID: projection.ShardID{Consumer: "agent_workload", Instance: projection.SharedInstance}, Status: projection.StatusIdle, UpdatedAt: now},
		{ShardID: projection.ShardID{Consumer: "agent_workload", Instance: projection.RebuildInstance}, Status: projection.StatusIdle, UpdatedAt: now},
		{ShardID: projection.ShardID{Consumer: "customer_history", Instance: projection.SharedInstance}, Status: projection.StatusProcessing, UpdatedAt: now},
		{ShardID: projection.ShardID{Consumer: "live_counter", Instance: "host-1"}, Status: projection.StatusIdle, UpdatedAt: now},
	}
	rebuilds := []rebuild.Rebuild{
		{ID: 3, Name: "agent_workload", Version: 2, Mode: rebuild.BlueGreen, Status: rebuild.Building, TotalEvents: 1000, Remaining: 550, RequestedAt: now},
		{ID: 4, Name: "customer_history", Version: 1, Mode: rebuild.InPlace, Status: rebuild.Building, TotalEvents: 200, Remaining: 50, RequestedAt: now},
	}

	var table bytes.Buffer
	if err := WriteStatusWithRebuilds(&table, shards, rebuilds, false); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"__rebuild__ (rebuild 3: v2 shadow)",
		"__shared__ (rebuild 4: in place, v1)",
		"__rebuild__ is a blue/green rebuild's shadow shard",
		"REBUILDS IN PROGRESS",
		"45% (450/1000 events)",
		"75% (150/200 events)",
	} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("status table lacks %q:\n%s", want, table.String())
		}
	}
	if strings.Count(table.String(), "(rebuild ") != 2 {
		t.Errorf("the rebuild is shown on a shard that does not carry it out:\n%s", table.String())
	}

	var js bytes.Buffer
	if err := WriteStatusWithRebuilds(&js, shards, rebuilds, true); err != nil {
		t.Fatal(err)
	}
	var got []ShardJSON
	if err := json.Unmarshal(js.Bytes(), &got); err != nil {
		t.Fatalf("status -o json: %v\n%s", err, js.String())
	}
	roles := []string{RoleShared, RoleRebuildShadow, RoleShared, RolePerInstance}
	for i, s := range got {
		if s.Role != roles[i] {
			t.Errorf("shard %s@%s: role %q, want %q", s.Consumer, s.Instance, s.Role, roles[i])
		}
	}
	if r := got[1].Rebuild; r == nil || r.ID != 3 || r.Progress != 0.45 || r.Done != 450 || r.Total != 1000 || r.Mode != "blue-green" || r.Version != 2 {
		t.Errorf("shadow shard's rebuild: %+v", r)
	}
	if r := got[2].Rebuild; r == nil || r.ID != 4 || r.Progress != 0.75 || r.Mode != "in-place" {
		t.Errorf("in-place rebuild on the live shard: %+v", r)
	}
	if got[0].Rebuild != nil || got[3].Rebuild != nil {
		t.Errorf("a shard that rebuilds nothing carries a rebuild: %+v, %+v", got[0].Rebuild, got[3].Rebuild)
	}

	// Without rebuilds the table is as before: no section, no legend
	// unless a shadow shard is listed.
	var plain bytes.Buffer
	if err := WriteStatus(&plain, []projection.ShardState{shards[0], shards[3]}, false); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(plain.String(), "REBUILD") || strings.Contains(plain.String(), "__rebuild__") {
		t.Errorf("status without rebuilds mentions them:\n%s", plain.String())
	}
}
