package projection_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

// What holds the horizon during a split (issue 21; docs/performance.md,
// "Measured on events"). Every partition reads only events of transactions
// older than the oldest transaction id still running on the cluster
// (promise 3), so any transaction holding an id delays every partition's
// events committed after it took that id. With PROJECTOR_TEST_LATENCY_HORIZON
// set, TestPartitionSplitMergeEventLatency samples pg_stat_activity every
// couple of milliseconds from a connection of its own and reports, per
// phase, which transactions held an id and for how long, by role: the
// writers and the split command name themselves (application_name), the
// dispatchers' passes are the other backends that ran the test schema's
// statements, anything else is another session's.

// horizonEnv turns the sampler on.
const horizonEnv = "PROJECTOR_TEST_LATENCY_HORIZON"

// Application names of the latency test's roles.
const (
	appWriter  = "latency-writer"
	appCommand = "latency-split-command"
)

// horizonObs is one backend holding a transaction id in one sample.
type horizonObs struct {
	pid                     int32
	xid                     string
	xactStart               time.Time
	state, waitType, waitEv string
	app, query, blockedBy   string
	locks                   string // advisory locks held, by name
}

// horizonSample is one look at pg_stat_activity.
type horizonSample struct {
	at      time.Time // the server's clock_timestamp(), taken in the statement
	local   time.Time // the test's clock, once the answer came back
	horizon uint64    // pg_snapshot_xmin of the sample's snapshot
	obs     []horizonObs
}

// horizonSampler samples the transactions holding an id.
type horizonSampler struct {
	schema  string
	mu      sync.Mutex
	samples []horizonSample
	// offset: the test's clock minus the server's (the least over the
	// samples of local - at: the answer's way back), to place samples on
	// the test's timeline.
	offset time.Duration
	txs    map[evKey]uint64 // each event's transaction id, as its append returned it
}

// horizonEvent is one event of a phase: when its writer's Commit returned
// and when AfterCommit saw it applied.
type horizonEvent struct {
	key           evKey
	commit, apply time.Time
}

// committed notes the transaction id of stream's events from..to.
func (s *horizonSampler) committed(stream string, from, to int64, tx uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for v := from; v <= to; v++ {
		s.txs[evKey{stream, v}] = tx
	}
}

// horizonSampling reports whether the sampler is on.
func horizonSampling() bool { return os.Getenv(horizonEnv) != "" }

// startHorizonSampler samples until stop closes, on bg.
func startHorizonSampler(t testing.TB, ctx context.Context, schema, consumer string, stop <-chan struct{}, bg *sync.WaitGroup) *horizonSampler {
	t.Helper()
	// The advisory locks each backend holds, by name: its partitions'
	// shard locks, the consumer's fence and its layout gate (keys as
	// projection's shardLockKey and gateLockKey build them).
	labels := []string{"fence", "gate"}
	keys := []string{"projector.shard\x1f" + schema + "\x1f" + consumer + "\x1f" + projection.SharedInstance,
		"projector.partition-gate\x1f" + schema + "\x1f" + consumer}
	for _, n := range []int{2, 4, 8, 16} {
		for p := range n {
			labels = append(labels, fmt.Sprintf("%d/%d", p, n))
			keys = append(keys, "projector.shard\x1f"+schema+"\x1f"+consumer+"\x1f"+projection.PartitionPrefix+fmt.Sprintf("%d/%d", p, n))
		}
	}
	conn, err := pgx.ConnectConfig(ctx, pgtest.ConnConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	s := &horizonSampler{schema: schema, offset: time.Hour, txs: map[evKey]uint64{}}
	bg.Go(func() {
		defer conn.Close(context.WithoutCancel(ctx))
		const sql = `WITH k AS MATERIALIZED (SELECT label, hashtextextended(key, 0) AS h FROM unnest($1::text[], $2::text[]) AS u(label, key))
			SELECT n.now, pg_snapshot_xmin(pg_current_snapshot())::text::bigint, a.pid, a.backend_xid::text, a.xact_start,
				coalesce(a.state, ''), coalesce(a.wait_event_type, ''), coalesce(a.wait_event, ''), coalesce(a.application_name, ''),
				left(coalesce(a.query, ''), 160),
				CASE WHEN a.wait_event_type = 'Lock' THEN array_to_string(pg_blocking_pids(a.pid), ',') ELSE '' END,
				coalesce((SELECT string_agg(k.label || CASE WHEN l.mode = 'ShareLock' THEN '(shared)' ELSE '' END || CASE WHEN l.granted THEN '' ELSE '(waiting)' END, ' ' ORDER BY k.label)
					FROM pg_locks l JOIN k ON l.classid::bigint = (k.h >> 32) & 4294967295 AND l.objid::bigint = k.h & 4294967295
					WHERE l.locktype = 'advisory' AND l.pid = a.pid), '')
			FROM (SELECT clock_timestamp() AS now) n LEFT JOIN pg_stat_activity a ON a.backend_xid IS NOT NULL AND a.pid <> pg_backend_pid()`
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			rows, err := conn.Query(ctx, sql, labels, keys)
			if err != nil {
				t.Error(err)
				return
			}
			var smp horizonSample
			for rows.Next() {
				var pid *int32
				var xid *string
				var start *time.Time
				var o horizonObs
				if err := rows.Scan(&smp.at, &smp.horizon, &pid, &xid, &start, &o.state, &o.waitType, &o.waitEv, &o.app, &o.query, &o.blockedBy, &o.locks); err != nil {
					t.Error(err)
					rows.Close()
					return
				}
				if pid == nil {
					continue
				}
				o.pid, o.xid = *pid, *xid
				if start != nil {
					o.xactStart = *start
				}
				smp.obs = append(smp.obs, o)
			}
			if err := rows.Err(); err != nil {
				t.Error(err)
				return
			}
			smp.local = time.Now()
			s.mu.Lock()
			s.samples = append(s.samples, smp)
			s.offset = min(s.offset, smp.local.Sub(smp.at))
			s.mu.Unlock()
		}
	})
	return s
}

// horizonHold is one transaction id's life as the samples saw it.
type horizonHold struct {
	pid         int32
	xid         string
	role        string
	part        string    // the partition whose lock it held
	first, last time.Time // on the test's clock
	xactStart   time.Time
	steps       []string // what it did, each change once
	oldest      int      // samples in which it was the oldest id
}

func (h *horizonHold) seen() time.Duration { return h.last.Sub(h.first) }

// horizonWindow is a phase of the run to report on.
type horizonWindow struct {
	name     string
	from, to time.Time
	events   []horizonEvent // the phase's events
}

// horizonAge is, at one sample, how long the transaction id holding the
// horizon (the oldest running) had held one.
type horizonAge struct {
	at      time.Time
	horizon uint64
	age     time.Duration
	hold    *horizonHold
}

// holds returns every transaction id seen, with its role, and at every
// sample the age of the one holding the horizon.
func (s *horizonSampler) holds() ([]*horizonHold, []horizonAge) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ours := map[int32]bool{} // backends that ran the test schema's statements
	for _, smp := range s.samples {
		for _, o := range smp.obs {
			if strings.Contains(o.query, s.schema) {
				ours[o.pid] = true
			}
		}
	}
	byKey := map[string]*horizonHold{}
	var out []*horizonHold
	var ages []horizonAge
	for _, smp := range s.samples {
		at := smp.at.Add(s.offset)
		ha := horizonAge{at: at, horizon: smp.horizon}
		for _, o := range smp.obs {
			key := fmt.Sprint(o.pid, "/", o.xid)
			h := byKey[key]
			if h == nil {
				h = &horizonHold{pid: o.pid, xid: o.xid, first: at, xactStart: o.xactStart.Add(s.offset)}
				switch {
				case o.app == appWriter:
					h.role = "writer"
				case o.app == appCommand:
					h.role = "command"
				case strings.HasPrefix(o.app, "latency-"):
					h.role = "pass " + strings.TrimPrefix(o.app, "latency-")
				case ours[o.pid]:
					h.role = "pass"
				default:
					h.role = "other session (" + o.app + ")"
				}
				byKey[key] = h
				out = append(out, h)
			}
			h.last = at
			if strings.HasPrefix(h.role, "pass") && strings.Contains(o.locks, "fence(shared)") {
				h.role = "splitting " + h.role // a pass that holds the fence splits at its commit
			}
			if h.part == "" {
				for _, l := range strings.Fields(o.locks) {
					if strings.Contains(l, "/") && !strings.Contains(l, "(") {
						h.part = l
					}
				}
			}
			if o.xid == fmt.Sprint(uint32(smp.horizon)) {
				h.oldest++
				ha.age, ha.hold = at.Sub(h.first), h
			}
			step := o.state
			if o.waitType != "" {
				step += " wait " + o.waitType + "/" + o.waitEv
				if o.blockedBy != "" {
					step += " by " + o.blockedBy
				}
			}
			if o.locks != "" {
				step += " [" + o.locks + "]"
			}
			step += ": " + shortQuery(o.query, s.schema)
			if len(h.steps) == 0 || h.steps[len(h.steps)-1] != step {
				h.steps = append(h.steps, step)
			}
		}
		ages = append(ages, ha)
	}
	return out, ages
}

// shortQuery is q without the schema's name and its whitespace runs.
func shortQuery(q, schema string) string {
	q = strings.ReplaceAll(q, `"`+schema+`".`, "")
	q = strings.ReplaceAll(q, schema+".", "")
	return strings.Join(strings.Fields(q), " ")
}

// report logs, per window, the transactions that held an id in it, the
// longest first, and the longest of each role.
func (s *horizonSampler) report(t testing.TB, windows []horizonWindow) {
	t.Helper()
	all, ages := s.holds()
	s.mu.Lock()
	n := len(s.samples)
	var gaps []time.Duration
	for i := 1; i < n; i++ {
		gaps = append(gaps, s.samples[i].at.Sub(s.samples[i-1].at))
	}
	s.mu.Unlock()
	if len(gaps) > 0 {
		slices.Sort(gaps)
		t.Logf("horizon: %d samples, median %.1f ms apart (p99 %.1f ms)", n, hms(gaps[len(gaps)/2]), hms(gaps[len(gaps)*99/100]))
	}
	for _, w := range windows {
		var in []*horizonHold
		for _, h := range all {
			if !h.last.Before(w.from) && !h.first.After(w.to) {
				in = append(in, h)
			}
		}
		slices.SortFunc(in, func(a, b *horizonHold) int { return int(b.seen() - a.seen()) })
		byRole := map[string][]time.Duration{}
		for _, h := range in {
			role, _, _ := strings.Cut(h.role, " (")
			byRole[role] = append(byRole[role], h.seen())
		}
		var roles []string
		for r, ds := range byRole {
			slices.Sort(ds)
			roles = append(roles, fmt.Sprintf("%s %d ids, seen for median %.1f ms, longest %.1f ms", r, len(ds), hms(ds[len(ds)/2]), hms(ds[len(ds)-1])))
		}
		slices.Sort(roles)
		var held horizonAge // the longest the horizon stood behind one id
		for _, a := range ages {
			if !a.at.Before(w.from) && !a.at.After(w.to) && a.age >= held.age {
				held = a
			}
		}
		by := "nothing"
		if held.hold != nil {
			by = fmt.Sprintf("%s %s pid %d xid %s at %+.1f ms", held.hold.role, held.hold.part, held.hold.pid, held.hold.xid, hms(held.at.Sub(w.from)))
		}
		s.blame(t, w, ages)
		t.Logf("horizon %s (%.0f ms): the horizon stood behind one id at most %.1f ms (%s); ids: %s",
			w.name, hms(w.to.Sub(w.from)), hms(held.age), by, strings.Join(roles, "; "))
		for i, h := range in {
			steps := strings.Join(h.steps, " | ")
			if i >= 6 && h.role != "command" && !strings.HasPrefix(h.role, "splitting") && !strings.Contains(steps, "wait Lock") {
				continue // the longest, and every command's, splitting pass's and lock waiter's
			}
			t.Logf("horizon %s:   %s %s pid %d xid %s: id seen %+.1f..%+.1f ms (%.1f ms; transaction began %+.1f ms), oldest id in %d samples: %s",
				w.name, h.role, h.part, h.pid, h.xid, hms(h.first.Sub(w.from)), hms(h.last.Sub(w.from)), hms(h.seen()), hms(h.xactStart.Sub(w.from)), h.oldest,
				strings.Join(shorten(h.steps), " | "))
		}
	}
}

// shorten keeps each step to a readable length.
func shorten(steps []string) []string {
	out := make([]string, len(steps))
	for i, s := range steps {
		if len(s) > 110 {
			s = s[:110] + "…"
		}
		out[i] = s
	}
	return out
}

func hms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// horizonStore is a store over schema whose pool names its backends app.
func horizonStore(t testing.TB, e *env, app string, maxConns int32) *postgres.Store {
	t.Helper()
	cfg := pgtest.PoolConfig(t)
	cfg.MaxConns = maxConns
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	return e.storeOn(pgtest.PoolFromConfig(t, cfg))
}

// blame splits each event's latency of w in two: from its commit to the
// first sample whose horizon had passed its transaction (the wait for
// older transactions, promise 3: what a transaction holding an id costs
// every partition), and from there to its apply (its partition's passes).
// It logs both for the phase and, for the event that waited longest, the
// transactions that held the horizon while it waited for it.
func (s *horizonSampler) blame(t testing.TB, w horizonWindow, ages []horizonAge) {
	t.Helper()
	if len(w.events) == 0 {
		return
	}
	s.mu.Lock()
	txs := s.txs
	s.mu.Unlock()
	var horizonWaits, passWaits []time.Duration
	var worst horizonEvent
	var worstVisible time.Time
	for _, ev := range w.events {
		tx, ok := txs[ev.key]
		if !ok {
			continue
		}
		// The horizon passes tx only once tx committed, which is before
		// the writer's Commit returned: look from a little before.
		i, _ := slices.BinarySearchFunc(ages, ev.commit.Add(-20*time.Millisecond), func(a horizonAge, at time.Time) int { return a.at.Compare(at) })
		for i < len(ages) && ages[i].horizon <= tx {
			i++
		}
		if i == len(ages) {
			continue
		}
		visible := ages[i].at
		hw := max(visible.Sub(ev.commit), 0)
		pw := max(ev.apply.Sub(ev.commit)-hw, 0)
		horizonWaits, passWaits = append(horizonWaits, hw), append(passWaits, pw)
		if ev.apply.Sub(ev.commit) > worst.apply.Sub(worst.commit) {
			worst, worstVisible = ev, visible
		}
	}
	if len(horizonWaits) == 0 {
		return
	}
	slices.Sort(horizonWaits)
	slices.Sort(passWaits)
	q := func(d []time.Duration, p int) float64 { return hms(d[min(len(d)-1, len(d)*p/100)]) }
	t.Logf("horizon %s: %d events; commit to the horizon passing it (sampled): p50 %.1f, p99 %.1f, max %.1f ms; from there to its apply: p50 %.1f, p99 %.1f, max %.1f ms",
		w.name, len(horizonWaits), q(horizonWaits, 50), q(horizonWaits, 99), q(horizonWaits, 100), q(passWaits, 50), q(passWaits, 99), q(passWaits, 100))
	if worst.commit.IsZero() {
		return
	}
	var holders []string
	seen := map[*horizonHold]bool{}
	for _, a := range ages {
		if a.at.Before(worst.commit) || a.at.After(worstVisible) || a.hold == nil || seen[a.hold] {
			continue
		}
		seen[a.hold] = true
		holders = append(holders, fmt.Sprintf("%s %s xid %s (id seen %.1f ms)", a.hold.role, a.hold.part, a.hold.xid, hms(a.hold.seen())))
	}
	hw := max(worstVisible.Sub(worst.commit), 0)
	t.Logf("horizon %s: the longest wait, %s v%d (partition %d/4): %.1f ms, of which %.1f ms until the horizon passed it (committed %+.1f ms, applied %+.1f ms from the phase's start); oldest ids meanwhile: %s",
		w.name, worst.key.stream, worst.key.version, streamSeg4(worst.key.stream), hms(worst.apply.Sub(worst.commit)), hms(hw),
		hms(worst.commit.Sub(w.from)), hms(worst.apply.Sub(w.from)), strings.Join(holders, ", "))
}
