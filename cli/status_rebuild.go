package cli

import (
	"fmt"
	"io"
	"time"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/rebuild"
)

// The roles of a shard in `status -o json` ("role"), so a script tells the
// shadow shard of a blue/green rebuild from a consumer's live shard without
// knowing the reserved instance ids.
const (
	// RoleShared: the live shard of a shared consumer.
	RoleShared = "shared"
	// RolePerInstance: one process's shard of a per-instance consumer.
	RolePerInstance = "per-instance"
	// RoleRebuildShadow: the second cursor of a blue/green rebuild, building
	// the new version into shadow tables no reader uses yet.
	RoleRebuildShadow = "rebuild-shadow"
	// RolePartition: one partition of a partitioned consumer.
	RolePartition = "partition"
	// RolePartitionFence: the unpartitioned row of a partitioned consumer,
	// which only fences binaries that do not know partitions.
	RolePartitionFence = "partition-fence"
)

// ShardRebuildJSON is the rebuild a shard is carrying out, in `status -o
// json` ("rebuild"): on the shadow shard for a blue/green rebuild, on the
// live shard for one in place.
type ShardRebuildJSON struct {
	ID       int64   `json:"id"`
	Version  int     `json:"version"`
	Mode     string  `json:"mode"`
	Status   string  `json:"status"`
	Progress float64 `json:"progress"`
	Done     int64   `json:"events_done"`
	Total    int64   `json:"events_total"`
}

func shardRole(s projection.ShardState) string {
	switch {
	case s.Partitions > 0:
		return RolePartition
	case s.Fence():
		return RolePartitionFence
	}
	switch s.Instance {
	case projection.SharedInstance:
		return RoleShared
	case projection.RebuildInstance:
		return RoleRebuildShadow
	}
	return RolePerInstance
}

// rebuildOf returns the rebuild the shard carries out, if any.
func rebuildOf(s projection.ShardState, rebuilds []rebuild.Rebuild) *rebuild.Rebuild {
	return rebuild.ForShard(rebuilds, s.ShardID)
}

func shardRebuildJSON(r *rebuild.Rebuild) *ShardRebuildJSON {
	if r == nil {
		return nil
	}
	return &ShardRebuildJSON{ID: r.ID, Version: r.Version, Mode: string(r.Mode), Status: string(r.Status),
		Progress: r.Progress(), Done: r.TotalEvents - r.Remaining, Total: r.TotalEvents}
}

// instanceCell renders the INSTANCE column, saying what the reserved ids
// are: the shadow shard of a rebuild is not a process's instance.
func instanceCell(s projection.ShardState, r *rebuild.Rebuild) string {
	switch {
	case s.Instance == projection.RebuildInstance && r != nil && r.Mode == rebuild.InlineRebuild:
		return fmt.Sprintf("%s (rebuild %d: inline v%d shadow)", s.Instance, r.ID, r.Version)
	case s.Instance == projection.RebuildInstance && r != nil:
		return fmt.Sprintf("%s (rebuild %d: v%d shadow)", s.Instance, r.ID, r.Version)
	case s.Instance == projection.RebuildInstance:
		return s.Instance + " (rebuild shadow)"
	case r != nil:
		return fmt.Sprintf("%s (rebuild %d: in place, v%d)", projector.Printable(s.Instance), r.ID, r.Version)
	case s.Partitions > 0 && s.Held:
		return fmt.Sprintf("  partition %d/%d (owner %s, held at %s for a merge)", s.Partition, s.Partitions, cmpOr(projector.Printable(s.Owner), "none"), cursor(s.Hold))
	case s.Partitions > 0:
		return fmt.Sprintf("  partition %d/%d (owner %s, %s)", s.Partition, s.Partitions, cmpOr(projector.Printable(s.Owner), "none"), loadCell(s))
	case s.Fence():
		return s.Instance + " (partitioned: fence)"
	}
	return projector.Printable(s.Instance)
}

// loadCell renders a partition's load: the rate its streams receive
// events at, and its skew when there is one to tell ("in 12.5/s, skew
// 3.10 HOT").
func loadCell(s projection.ShardState) string {
	out := fmt.Sprintf("in %.1f/s", s.InRate)
	if s.Skew > 0 {
		out += fmt.Sprintf(", skew %.2f", s.Skew)
	}
	if s.Hot() {
		out += " HOT"
	}
	return out
}

// shardStatusCell renders the STATUS column: the shard's status, or for a
// healthy shard carrying out an active rebuild, the rebuild's status and
// progress ("building 45%"), which is what the shard is doing.
func shardStatusCell(s projection.ShardState, r *rebuild.Rebuild) string {
	status := string(s.Status)
	switch {
	case s.Failing():
		status += " (failing)"
	case r != nil && r.Active() && (s.Status == projection.StatusIdle || s.Status == projection.StatusProcessing):
		status = fmt.Sprintf("%s %.0f%%", r.Status, 100*r.Progress())
	}
	return status
}

// progressCell renders a rebuild's progress: "45% (450/1000 events)".
func progressCell(r rebuild.Rebuild) string {
	return fmt.Sprintf("%.0f%% (%d/%d events)", 100*r.Progress(), r.TotalEvents-r.Remaining, r.TotalEvents)
}

// shardsJSON is shards as `-o json` lists them: each with its role and the
// rebuild it carries out.
func shardsJSON(shards []projection.ShardState, rebuilds []rebuild.Rebuild) []ShardJSON {
	out := make([]ShardJSON, len(shards))
	for i, s := range shards {
		out[i] = toJSON(s)
		if s.Fence() {
			out[i] = summarizeFence(s, shards).json()
		}
		out[i].Rebuild = shardRebuildJSON(rebuildOf(s, rebuilds))
	}
	return out
}

// StatusJSON is `status -o json`: an object, so the horizon (which holds
// back every shard at once) sits beside the shards rather than in each.
// `consumer list -o json` is the bare array of shards, as `status -o json`
// was before the horizon joined it.
type StatusJSON struct {
	Shards []ShardJSON `json:"shards"`
	// Horizon is how far the horizon is held back and by which
	// transaction: the same as `horizon -o json`.
	Horizon projection.HorizonReport `json:"horizon"`
}

// WriteStatusJSON writes `status -o json`: the shards (with their roles and
// rebuilds, as `consumer list -o json` lists them) and the horizon report.
func WriteStatusJSON(w io.Writer, shards []projection.ShardState, rebuilds []rebuild.Rebuild, horizon projection.HorizonReport) error {
	if horizon.Others == nil {
		horizon.Others = []projection.HorizonHolder{}
	}
	return writeJSON(w, StatusJSON{Shards: shardsJSON(shards, rebuilds), Horizon: horizon})
}

// WriteStatusWithRebuilds renders shards as the `status` command does, with
// the rebuilds in progress (rebuild.InProgress): as JSON, each shard
// carrying its role and the rebuild it carries out; as a table, the shards
// (a shadow shard's instance saying which rebuild it builds) and then the
// rebuilds with their percentage.
func WriteStatusWithRebuilds(w io.Writer, shards []projection.ShardState, rebuilds []rebuild.Rebuild, asJSON bool) error {
	if asJSON {
		return writeJSON(w, shardsJSON(shards, rebuilds))
	}
	if len(shards) == 0 {
		_, err := fmt.Fprintln(w, "no consumers registered yet (they appear when a dispatcher first starts)")
		return err
	}
	now := time.Now()
	shadows := false
	err := writeTable(w, func(tw io.Writer) {
		fmt.Fprintln(tw, "CONSUMER\tINSTANCE\tSTATUS\tDISPATCHER\tCURSOR\tLAG\tLAG AGE\tATTEMPTS\tLAST ERROR")
		for _, s := range shards {
			r := rebuildOf(s, rebuilds)
			status := shardStatusCell(s, r)
			if s.Fence() {
				f := summarizeFence(s, shards)
				s, status = f.shard, f.statusCell()
			}
			lagAge := age(s.LagSeconds)
			if s.Instance == projection.RebuildInstance {
				// The age of the oldest event a shadow has still to replay
				// is the log's age, not a delay: its progress says more.
				lagAge = "-"
			}
			shadows = shadows || s.Instance == projection.RebuildInstance
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%d\t%s\n", projector.Printable(s.Consumer), instanceCell(s, r), status,
				dispatcher(s, now), cursor(s.Cursor), s.LagEvents, lagAge, s.Attempts, text(s.LastError, cellText))
		}
	})
	if err != nil {
		return err
	}
	if err := writeParkedShards(w, shards); err != nil {
		return err
	}
	if shadows {
		if _, err := fmt.Fprintln(w, "\n__rebuild__ is a blue/green rebuild's shadow shard: it builds the new version into shadow tables\nno reader uses; the live model is the __shared__ shard's until the switch."); err != nil {
			return err
		}
	}
	var active []rebuild.Rebuild
	for _, r := range rebuilds {
		if r.Active() {
			active = append(active, r)
		}
	}
	if len(active) == 0 {
		return nil
	}
	if _, err := fmt.Fprintln(w, "\nREBUILDS IN PROGRESS (`rebuild list` for all)"); err != nil {
		return err
	}
	return writeTable(w, func(tw io.Writer) {
		fmt.Fprintln(tw, "ID\tPROJECTION\tVERSION\tMODE\tSTATUS\tPROGRESS\tREQUESTED")
		for _, r := range active {
			status := string(r.Status)
			if r.Status == rebuild.Ready {
				status += " (held: rebuild switch " + projector.Printable(r.Name) + ")"
			}
			fmt.Fprintf(tw, "%d\t%s\tv%d\t%s\t%s\t%s\t%s\n", r.ID, projector.Printable(r.Name), r.Version, r.Mode, status, progressCell(r), ago(r.RequestedAt, now))
		}
	})
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// writeParkedShards lists the shards with open parks (ParkStream), if any:
// streams whose read model is held back until an operator acts.
func writeParkedShards(w io.Writer, shards []projection.ShardState) error {
	var parked []projection.ShardState
	for _, s := range shards {
		if s.Parked > 0 {
			parked = append(parked, s)
		}
	}
	if len(parked) == 0 {
		return nil
	}
	if _, err := fmt.Fprintln(w, "\nPARKED STREAMS (held back until retried or discarded)"); err != nil {
		return err
	}
	return writeTable(w, func(tw io.Writer) {
		fmt.Fprintln(tw, "CONSUMER\tINSTANCE\tPARKED\tSEE")
		for _, s := range parked {
			fmt.Fprintf(tw, "%s\t%s\t%d\tparked list --consumer %s\n", projector.Printable(s.Consumer), projector.Printable(s.Instance),
				s.Parked, projector.Printable(s.Consumer))
		}
	})
}
