package cli

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/projection"
)

// A partitioned consumer's unpartitioned row (its fence) is stored as
// "disabled", so that binaries that do not know partitions stand aside and
// retention passes over it. Shown as stored, `status` would call a healthy
// partitioned consumer disabled, with the lag of a cursor no partition
// uses. The CLI shows the fence as what it stands for instead: the
// consumer, partitioned, with its partitions' aggregate state (the console
// does the same, console/partitions.go).

// StatusPartitioned is the status `status` and `consumer status` show (and
// -o json reports) for a partitioned consumer's fence row: the consumer is
// partitioned; its partitions have the statuses.
const StatusPartitioned = "partitioned"

// PartitionsJSON is the aggregate of a partitioned consumer's partitions,
// on its fence row in -o json ("partitioned").
type PartitionsJSON struct {
	// Count is how many partitions the consumer has; Statuses how many are
	// in each status (idle, processing, dead, disabled); Failing how many
	// retry a failing event; Held how many a merge holds; Hot how many
	// are hot (skewed).
	Count    int            `json:"count"`
	Statuses map[string]int `json:"statuses"`
	Failing  int            `json:"failing"`
	Held     int            `json:"held"`
	Hot      int            `json:"hot"`
	// StoredStatus is the fence row's own status, "disabled": it only
	// keeps binaries that do not know partitions from running the
	// consumer unpartitioned.
	StoredStatus string `json:"stored_status"`
}

// fenceSummary is a fence row rewritten to stand for its consumer: cursor
// the slowest partition's (the consumer applied every event up to it), lag
// the sum of the partitions' (each counts its own streams), lag age the
// oldest, attempts and processed summed, dispatcher live when one runs any
// partition; and the partitions' aggregate.
type fenceSummary struct {
	shard projection.ShardState
	parts PartitionsJSON
}

// summarizeFence rewrites fence from the partitions of its consumer among
// shards (the others are ignored).
func summarizeFence(fence projection.ShardState, shards []projection.ShardState) fenceSummary {
	out := fenceSummary{shard: fence, parts: PartitionsJSON{Statuses: map[string]int{}, StoredStatus: string(fence.Status)}}
	s := &out.shard
	s.LagEvents, s.LagSeconds, s.Attempts, s.Processed, s.Parked = 0, 0, 0, 0, 0
	// The fence's note is for binaries that do not know partitions.
	s.LastError, s.LastErrorAt, s.FailedAt, s.NextRetryAt = "", time.Time{}, projector.Position{}, time.Time{}
	s.Dispatcher = projection.DispatcherNone
	for _, p := range shards {
		if p.Consumer != fence.Consumer || p.Partitions == 0 {
			continue
		}
		if out.parts.Count == 0 || p.Cursor.Less(s.Cursor) {
			s.Cursor = p.Cursor
		}
		out.parts.Count++
		out.parts.Statuses[string(p.Status)]++
		if p.Failing() {
			out.parts.Failing++
		}
		if p.Held {
			out.parts.Held++
		}
		if p.Hot() {
			out.parts.Hot++
		}
		s.LagEvents += p.LagEvents
		s.LagSeconds = max(s.LagSeconds, p.LagSeconds)
		s.Attempts += p.Attempts
		s.Processed += p.Processed
		s.Parked += p.Parked
		if p.Dispatcher == projection.DispatcherLive {
			s.Dispatcher = projection.DispatcherLive
		}
		if p.LastSeen.After(s.LastSeen) {
			s.LastSeen = p.LastSeen
		}
	}
	return out
}

// statusCell renders the fence's STATUS: "partitioned (4)" while every
// partition is idle or processing and none is failing, else with what
// needs an operator: "partitioned (4: 1 dead, 1 failing)".
func (f fenceSummary) statusCell() string {
	var notes []string
	for _, st := range []projection.Status{projection.StatusDead, projection.StatusDisabled} {
		if n := f.parts.Statuses[string(st)]; n > 0 {
			notes = append(notes, fmt.Sprintf("%d %s", n, st))
		}
	}
	var others []string
	for st, n := range f.parts.Statuses {
		switch projection.Status(st) {
		case projection.StatusIdle, projection.StatusProcessing, projection.StatusDead, projection.StatusDisabled:
		default:
			others = append(others, fmt.Sprintf("%d %s", n, st))
		}
	}
	slices.Sort(others)
	notes = append(notes, others...)
	if f.parts.Failing > 0 {
		notes = append(notes, fmt.Sprintf("%d failing", f.parts.Failing))
	}
	if f.parts.Held > 0 {
		notes = append(notes, fmt.Sprintf("%d held for a merge", f.parts.Held))
	}
	if len(notes) == 0 {
		return fmt.Sprintf("%s (%d)", StatusPartitioned, f.parts.Count)
	}
	return fmt.Sprintf("%s (%d: %s)", StatusPartitioned, f.parts.Count, strings.Join(notes, ", "))
}

// json is the fence's -o json: the rewritten shard, status "partitioned",
// with the aggregate under "partitioned".
func (f fenceSummary) json() ShardJSON {
	j := toJSON(f.shard)
	j.Status = StatusPartitioned
	parts := f.parts
	j.Partitioned = &parts
	return j
}
