package console

import (
	"context"
	"fmt"
	"maps"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/rebuild"
	"github.com/projectorhq/projector/saga"
)

// Display states of a shard: the stored status, or "rebuilding" when a
// rebuild runs on it, "failing" when it retries an event. The page colours
// rows by them; the JSON carries them as "state".
const (
	StateIdle       = "idle"
	StateProcessing = "processing"
	StateFailing    = "failing"
	StateDead       = "dead"
	StateDisabled   = "disabled"
	StateRebuilding = "rebuilding"
	// StatePartitioned is the row of a partitioned consumer (its fence
	// shard, stored disabled): its partitions follow it, each in a state
	// of its own.
	StatePartitioned = "partitioned"
)

// Shard is one consumer shard as the console shows it: what `projector
// status` reads (projection.Admin.List), with the display state, the rate
// the console measured and the rebuild it carries out.
type Shard struct {
	projection.ShardState
	State string `json:"state"`
	// Rate is events applied per second over the last second or more;
	// negative until the console has read the shard twice.
	Rate    float64          `json:"rate"`
	Rebuild *rebuild.Rebuild `json:"rebuild,omitempty"`
	// PartitionCount and HotPartitions are set on a partitioned consumer's
	// row, whose lag, rate and processed count are its partitions' totals
	// (partitions.go).
	PartitionCount int `json:"partition_count,omitempty"`
	HotPartitions  int `json:"hot_partitions,omitempty"`
	// rebuilding: a rebuild of the consumer is in progress, on this shard
	// or its shadow.
	rebuilding bool
}

// SagaView is one saga's counts and its failed and active instances (the
// most recently updated, failed and overdue first), without their state
// (which may carry personal data, like a payload). Completed instances are
// counted, not listed.
type SagaView struct {
	Name      string `json:"name"`
	Failed    int64  `json:"failed"`
	Active    int64  `json:"active"`
	Completed int64  `json:"completed"`
	// Overdue counts the saga's timeouts already due and not fired.
	Overdue   int64               `json:"overdue_timeouts"`
	Instances []saga.InstanceInfo `json:"instances"`
}

// State is everything the dashboard shows, read in one go.
type State struct {
	ReadAt      time.Time                `json:"read_at"`
	Schema      string                   `json:"schema"`
	ReadOnly    bool                     `json:"read_only"`
	Shards      []Shard                  `json:"shards"`
	Horizon     projection.HorizonReport `json:"horizon"`
	Rebuilds    []rebuild.Rebuild        `json:"rebuilds"`
	DeadLetters []projection.DeadLetter  `json:"dead_letters"`
	Sagas       []SagaView               `json:"sagas"`
	// Log is the estimated size of the hot log and of the archive
	// (`streams archive`), as `projector status` prints it.
	Log LogSizes `json:"log"`
}

// LogSizes are the estimated events in projector_events and in
// projector_events_archive, from the planner's statistics
// (postgres.Store.ArchiveSizes): cheap on any log, approximate, -1 for a
// table never analyzed.
type LogSizes struct {
	Hot      int64 `json:"hot_events_estimate"`
	Archived int64 `json:"archived_events_estimate"`
}

// MinReadInterval is how often the console reads the database at most,
// however many pages are open: a read counts each shard's lag (as `status`
// does), which is not free on a long backlog, so pages opened in several
// tabs or by several operators share one read a second.
const MinReadInterval = time.Second

// readTimeout bounds one read of the state.
const readTimeout = 10 * time.Second

// stateCache holds the last read; one read runs at a time.
type stateCache struct {
	mu  sync.Mutex
	at  time.Time
	st  State
	err error
}

// read returns the state, read at most MinReadInterval ago.
func (c *Console) read(ctx context.Context) (State, error) {
	c.cache.mu.Lock()
	defer c.cache.mu.Unlock()
	if !c.cache.at.IsZero() && time.Since(c.cache.at) < MinReadInterval {
		return c.cache.st, c.cache.err
	}
	ctx, cancel := context.WithTimeout(ctx, readTimeout)
	defer cancel()
	st, err := c.readNow(ctx)
	if ctx.Err() == nil || err == nil { // a reader that went away is no answer for the others
		c.cache.at, c.cache.st, c.cache.err = time.Now(), st, err
	}
	return st, err
}

// invalidate makes the next read go to the database: an action's effect
// shows at once.
func (c *Console) invalidate() {
	c.cache.mu.Lock()
	defer c.cache.mu.Unlock()
	c.cache.at = time.Time{}
}

// readNow gathers the dashboard's state with the same library calls as
// `projector status`, `horizon`, `dead-letters list` and `saga list`.
func (c *Console) readNow(ctx context.Context) (State, error) {
	store := c.cfg.Store
	st := State{ReadAt: time.Now(), Schema: store.Schema(), ReadOnly: c.ReadOnly()}
	shards, err := projection.NewAdmin(store).List(ctx, "")
	if err != nil {
		return st, fmt.Errorf("console: list consumers: %w", err)
	}
	if st.Rebuilds, err = rebuild.InProgress(ctx, store); err != nil {
		return st, fmt.Errorf("console: %w", err)
	}
	if st.Horizon, err = projection.Horizon(ctx, store.Pool()); err != nil {
		return st, fmt.Errorf("console: %w", err)
	}
	if !c.cfg.ShowPayloads {
		hideQueries(&st.Horizon)
	}
	if st.Log.Hot, st.Log.Archived, err = store.ArchiveSizes(ctx); err != nil {
		return st, fmt.Errorf("console: %w", err)
	}
	if st.DeadLetters, err = projection.ListDeadLetters(ctx, store, projection.DeadLetterFilter{Status: projection.DeadLetterOpen, Limit: c.cfg.DeadLetterLimit}); err != nil {
		return st, fmt.Errorf("console: %w", err)
	}
	counts := make(map[string]int64, len(shards))
	for _, s := range shards {
		counts[s.ShardID.String()] = s.Processed
	}
	rates := c.rates.observe(st.ReadAt, counts)
	st.Shards = make([]Shard, len(shards))
	for i, s := range shards {
		sh := Shard{ShardState: s, State: string(s.Status), Rate: -1, Rebuild: rebuild.ForShard(st.Rebuilds, s.ShardID)}
		for _, r := range st.Rebuilds {
			sh.rebuilding = sh.rebuilding || (r.Name == s.Consumer && r.Active())
		}
		if r, ok := rates[s.ShardID.String()]; ok {
			sh.Rate = r
		}
		switch {
		case sh.Rebuild != nil && s.Status != projection.StatusDead && s.Status != projection.StatusDisabled:
			sh.State = StateRebuilding
		case s.Failing():
			sh.State = StateFailing
		}
		st.Shards[i] = sh
	}
	st.Shards = groupPartitions(st.Shards)
	failed, err := saga.FailedCounts(ctx, store)
	if err != nil {
		return st, fmt.Errorf("console: %w", err)
	}
	names := slices.Clone(c.cfg.Sagas)
	for _, n := range slices.Sorted(maps.Keys(failed)) {
		if !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	if len(names) == 0 {
		return st, nil
	}
	sums, err := saga.Summaries(ctx, store, names...)
	if err != nil {
		return st, fmt.Errorf("console: %w", err)
	}
	byName := map[string]saga.Summary{}
	for _, sum := range sums {
		byName[sum.Saga] = sum
	}
	for _, n := range names {
		sum := byName[n]
		v := SagaView{Name: n, Failed: sum.Failed, Active: sum.Active, Completed: sum.Completed, Overdue: sum.OverdueTimeouts}
		// Only what may need an operator: failed instances, and active
		// ones (overdue among them). Completed ones are a link away, not
		// a list that pushes the live tail off the screen.
		ins, err := saga.List(ctx, store, saga.ListQuery{Saga: n, Statuses: []saga.Status{saga.Active, saga.Failed}, Limit: c.cfg.SagaLimit})
		if err != nil {
			return st, fmt.Errorf("console: %w", err)
		}
		for i := range ins {
			ins[i].State = nil // a saga's state may carry personal data, like a payload
		}
		// Failed first, then overdue, then the rest, each newest first.
		rank := func(in saga.InstanceInfo) int {
			switch {
			case in.Status == saga.Failed:
				return 0
			case !in.NextTimeoutAt.IsZero() && !in.NextTimeoutAt.After(st.ReadAt):
				return 1
			}
			return 2
		}
		slices.SortStableFunc(ins, func(a, b saga.InstanceInfo) int { return rank(a) - rank(b) })
		v.Instances = ins
		st.Sagas = append(st.Sagas, v)
	}
	return st, nil
}

// cursorText renders a position as the CLI does: "tx/seq", "tx/max" for a
// cursor moved to the horizon.
func cursorText(p projector.Position) string {
	if p.Seq == math.MaxInt64 {
		return fmt.Sprintf("%d/max", p.TxID)
	}
	return p.String()
}

// Tile is one count of the summary line at the top of the dashboard.
type Tile struct {
	// State colours the tile: a shard state, or StateNone for a count of
	// nothing, which is never coloured as an alarm.
	State string
	Label string
	N     int
}

// StateNone is the display state of a tile that counts nothing.
const StateNone = "none"

// Tiles counts the shards by display state, the open dead letters, the
// parked streams and the rebuilds in progress: the state of the system at
// a glance. A tile that counts nothing is grey, whatever it counts ("0
// dead" is good news). A rebuild is one tile, "rebuilds", however many
// shards it runs on (the live one and its shadow): their rows say
// "rebuilding". Parked streams are amber: an idle consumer holding streams
// back is not all well. A rebuild's shadow parks are not counted (as in
// projector_parked_streams): they hold nothing of the live model back
// until its switch hands them over; the shadow's row shows them.
func (s State) Tiles() []Tile {
	by := map[string]int{}
	parked := 0
	for _, sh := range s.Shards {
		by[sh.State]++
		if sh.Instance != projection.RebuildInstance {
			parked += int(sh.Parked)
		}
	}
	tile := func(state, label string, n int) Tile {
		if n == 0 {
			state = StateNone
		}
		return Tile{State: state, Label: label, N: n}
	}
	var out []Tile
	for _, st := range []string{StateDead, StateFailing, StateProcessing, StateIdle, StateDisabled} {
		if by[st] > 0 || st == StateDead || st == StateIdle {
			out = append(out, tile(st, st, by[st]))
		}
	}
	return append(out, tile(StateDead, plural(len(s.DeadLetters), "open dead letter"), len(s.DeadLetters)),
		tile(StateFailing, plural(parked, "parked stream"), parked),
		tile(StateRebuilding, plural(len(s.Rebuilds), "rebuild"), len(s.Rebuilds)))
}

// plural is label for one, label+"s" for any other count.
func plural(n int, label string) string {
	if n == 1 {
		return label
	}
	return label + "s"
}

// actionView is one action button of a shard row.
type actionView struct {
	Kind, Op, Label, Class, Confirm string
	Fields                          map[string]string
}

// shardActions lists the actions a shard's state allows, as the guarded
// transitions define them (projection.Status): the page offers only those,
// and the transition checks again when it runs.
func shardActions(sh Shard, rebuildable bool) []actionView {
	fields := map[string]string{"consumer": sh.Consumer, "instance": sh.Instance}
	op := func(name, class, confirm string) actionView {
		return actionView{Kind: "consumer", Op: name, Label: name, Class: class, Confirm: confirm, Fields: fields}
	}
	id := sh.ShardID.String()
	var out []actionView
	if sh.Fence() {
		// The fence refuses every transition: its partitions have theirs.
		return rebuildAction(sh, rebuildable)
	}
	switch sh.Status {
	case projection.StatusDead:
		out = append(out, op("restart", "primary", "Retry the failing event of "+id+"?"),
			op("skip", "danger", "Move "+id+" past its failing event (recorded as a dead letter)?"))
	case projection.StatusProcessing:
		if sh.Failing() {
			out = append(out, op("skip", "danger", "Move "+id+" past its failing event (recorded as a dead letter)?"))
		}
	case projection.StatusDisabled:
		return append(out, op("enable", "primary", ""))
	}
	out = append(out, op("disable", "", "Stop "+id+"? Retention no longer waits for it."))
	return append(out, rebuildAction(sh, rebuildable)...)
}

// rebuildAction is the blue/green rebuild button of a consumer's row, if
// it declares tables and no rebuild runs.
func rebuildAction(sh Shard, rebuildable bool) []actionView {
	if !rebuildable || sh.Instance != projection.SharedInstance || sh.rebuilding || sh.Status == projection.StatusDead {
		return nil
	}
	return []actionView{{Kind: "rebuild", Op: "request", Label: "rebuild", Class: "",
		Confirm: "Rebuild " + sh.Consumer + " blue/green from the start of the log?", Fields: map[string]string{"name": sh.Consumer, "mode": "blue-green"}}}
}

// hideQueries drops the statements of the sessions holding the horizon
// back: another session's SQL may carry a password (ALTER ROLE … PASSWORD)
// or personal data, and the dashboard and state.json are read without
// signing in. They are shown, like payloads, only with
// [Config.ShowPayloads]; `projector horizon` shows them to an operator.
func hideQueries(h *projection.HorizonReport) {
	if h.Holder != nil {
		holder := *h.Holder
		holder.Query = ""
		h.Holder = &holder
	}
	h.Others = slices.Clone(h.Others)
	for i := range h.Others {
		h.Others[i].Query = ""
	}
}
