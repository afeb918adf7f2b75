package projection_test

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/projectorhq/projector/projection"
)

// logBuffer is an io.Writer of JSON log lines safe for the dispatcher's
// goroutines; lines decodes them.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) lines(t *testing.T) []map[string]any {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(b.buf.String()), "\n") {
		if l == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("log line %q: %v", l, err)
		}
		out = append(out, m)
	}
	return out
}

// last is the last line whose msg is msg, nil if none.
func last(lines []map[string]any, msg string) map[string]any {
	for i := len(lines) - 1; i >= 0; i-- {
		if lines[i]["msg"] == msg {
			return lines[i]
		}
	}
	return nil
}

// The dispatcher's log says what is true: with two processes running a
// consumer in 4 partitions, each said "started ... shards=4" while it
// worked 2. The started line now counts the partitions as declared, the
// balancing rounds say at Info which partitions each takes or gives up (the
// last such line's count is what it owns), and a stop ends with one
// "stopped" line, written before Stop returns.
func TestDispatcherLogSaysWhatItOwns(t *testing.T) {
	t.Parallel()
	e := partitioned(t)
	logs := map[string]*logBuffer{"log-a": {}, "log-b": {}}
	var ds []*projection.Dispatcher
	for _, id := range []string{"log-a", "log-b"} {
		p := counting(e.schema, e.types, "parted", projection.AsyncConfig{Partitions: 4})
		d, err := projection.New(projection.Config{Store: e.store, Projections: []*projection.Async{p}, InstanceID: id,
			PollMax: 50 * time.Millisecond, Recheck: 50 * time.Millisecond,
			Logger: slog.New(slog.NewJSONHandler(logs[id], &slog.HandlerOptions{Level: slog.LevelInfo}))})
		if err != nil {
			t.Fatal(err)
		}
		if err := d.Start(e.ctx); err != nil {
			t.Fatal(err)
		}
		ds = append(ds, d)
	}
	eventually(t, time.Minute, "each process to own 2 partitions and say so", func() bool {
		owners := e.owners("parted")
		for id, b := range logs {
			l := last(b.lines(t), "projection dispatcher: partitions taken/given up")
			if owners[id] != 2 || l == nil || l["owns"] != float64(2) {
				return false
			}
		}
		return true
	})
	for id, b := range logs {
		started := last(b.lines(t), "projection dispatcher: started")
		if started == nil || started["partitions_declared"] != float64(4) || started["shards"] != float64(0) || started["consumers"] != float64(1) {
			t.Errorf("%s: started line %v; want consumers=1 shards=0 partitions_declared=4", id, started)
		}
	}
	for i, d := range ds {
		if err := d.Stop(e.ctx); err != nil {
			t.Fatal(err)
		}
		id := []string{"log-a", "log-b"}[i]
		lines := logs[id].lines(t)
		if len(lines) == 0 || lines[len(lines)-1]["msg"] != "projection dispatcher: stopped" || lines[len(lines)-1]["instance_id"] != id {
			t.Errorf("%s: log after Stop ends with %v; want the stopped line", id, lines[len(lines)-1])
		}
	}
}

// A split the partitions' own passes carry out (a `consumer split` handed
// off to them) changes what this process runs outside a balancing round:
// the log says so at Info, naming the partition and its halves, as the
// rounds' lines do for what they take. (It said nothing above Debug.)
func TestDispatcherLogSaysWhatItsPassesSplit(t *testing.T) {
	t.Parallel()
	e := partitioned(t)
	var log logBuffer
	p := counting(e.schema, e.types, "selfsplit", projection.AsyncConfig{Partitions: 2})
	d, err := projection.New(projection.Config{Store: e.store, Projections: []*projection.Async{p}, InstanceID: "log-split",
		PollMax: 50 * time.Millisecond, Recheck: 50 * time.Millisecond,
		Logger: slog.New(slog.NewJSONHandler(&log, &slog.HandlerOptions{Level: slog.LevelInfo}))})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Start(e.ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = d.Stop(e.ctx) }()
	eventually(t, time.Minute, "the process to own both partitions and hold its alive lock", func() bool {
		return e.owners("selfsplit")["log-split"] == 2 && e.aliveLockHeld("log-split")
	})
	admin := projection.NewAdmin(e.store)
	projection.SetSplitHandOff(admin, 2*time.Minute) // the passes split, not the command after its wait
	if _, err := admin.Split(e.ctx, "selfsplit"); err != nil {
		t.Fatal(err)
	}
	// The command returns once the splits committed; a pass logs just
	// after its commit.
	var split map[string]string
	eventually(t, time.Minute, "both passes to say they split", func() bool {
		split = map[string]string{}
		for _, l := range log.lines(t) {
			if l["msg"] == "projection dispatcher: partition split by its pass" && l["consumer"] == "selfsplit" {
				split[l["partition"].(string)], _ = l["into"].(string)
			}
		}
		return len(split) >= 2
	})
	if split["0/2"] != "0/4 1/4" || split["1/2"] != "2/4 3/4" || len(split) != 2 {
		t.Errorf("split lines: %v; want 0/2 into 0/4 1/4 and 1/2 into 2/4 3/4", split)
	}
}

// aliveLockHeld reports whether the listening session of the dispatcher
// with instance id holds its alive lock (layoutnotify.go): until then a
// split command splits its partitions itself rather than hand them to its
// passes.
func (e *env) aliveLockHeld(instance string) bool {
	e.t.Helper()
	var held bool
	if err := e.store.Pool().QueryRow(e.ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
		AND ((l.classid::int8 << 32) | l.objid::int8) = hashtextextended($1, 0))`,
		projection.AliveLockKey(e.schema, instance)).Scan(&held); err != nil {
		e.t.Fatal(err)
	}
	return held
}
