package aggregate_test

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/aggregate"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/stores/postgres"
)

// BenchmarkLoad loads a 1,000-event ticket stream five ways in every
// iteration, back to back, so drift on a shared machine hits all alike:
//
//   - raw: the floor. One SELECT of the stream's version, type and data
//     columns in version order, each payload decoded with encoding/json into
//     its Go type and folded by the same fold functions, through a type
//     switch. No envelope, no metadata, no registry.
//   - read-stream: postgres.Store.ReadStream and the same type-switch fold,
//     to tell the store's envelope read from the aggregate layer's cost.
//   - load: Repository.Load without snapshots: the full envelope of every
//     event, payloads decoded through the registry, folds dispatched by type.
//   - snapshot-at-head: Load with a snapshot at version 1,000: one snapshot
//     row and an empty event read.
//   - snapshot-90-behind: Load with snapshots every 128 events written in
//     appends of 10, so the newest is at 910 and 90 events are folded.
//
// It reports each as µs per load and the full load's share of the raw rate.
func BenchmarkLoad(b *testing.B) {
	f := setup(b)
	const events, chunk = 1000, 10
	build := func(id string, snaps aggregate.Snapshots) (*aggregate.Repository[Ticket], projector.StreamRef) {
		r := f.repo(b, snaps)
		s := projector.Stream("ticket", id)
		for v := 0; v < events; v += chunk {
			payloads := make([]any, chunk)
			for i := range payloads {
				payloads[i] = testevents.TicketCommented{Body: fmt.Sprintf("comment %d: have you tried turning it off and on", v+i), N: v + i}
			}
			if v == 0 {
				payloads[0] = testevents.TicketOpened{Title: "printer on fire", Customer: "ada"}
			}
			writeTx(b, f, r, s, payloads...)
		}
		return r, s
	}
	plain, s := build("plain", aggregate.Snapshots{})
	atHead, sHead := build("at-head", aggregate.Snapshots{Every: 100})
	behind, sBehind := build("behind", aggregate.Snapshots{Every: 128})

	pool := f.store.Pool()
	rawSQL := `SELECT version, type, data FROM ` + f.store.Table("projector_events") + `
		WHERE tenant_id = $1 AND stream_type = $2 AND stream_id = $3 ORDER BY version`
	raw := func() (Ticket, int64) {
		rows, err := pool.Query(f.ctx, rawSQL, s.Tenant, s.Type, s.ID)
		if err != nil {
			b.Fatal(err)
		}
		defer rows.Close()
		var t Ticket
		var version int64
		var typ string
		var data []byte
		for rows.Next() {
			if err := rows.Scan(&version, &typ, &data); err != nil {
				b.Fatal(err)
			}
			switch typ {
			case "ticket.opened":
				var e testevents.TicketOpened
				if err := json.Unmarshal(data, &e); err != nil {
					b.Fatal(err)
				}
				t.opened(e)
			case "ticket.commented":
				var e testevents.TicketCommented
				if err := json.Unmarshal(data, &e); err != nil {
					b.Fatal(err)
				}
				t.commented(e)
			case "ticket.closed":
				var e testevents.TicketClosed
				if err := json.Unmarshal(data, &e); err != nil {
					b.Fatal(err)
				}
				t.closed(version, e)
			}
		}
		if err := rows.Err(); err != nil {
			b.Fatal(err)
		}
		return t, version
	}

	// Every way must produce the same state, or the comparison is void.
	want, wantVersion := raw()
	for _, c := range []struct {
		r         *aggregate.Repository[Ticket]
		s         projector.StreamRef
		from      int64
		fromLabel string
	}{{plain, s, 0, "none"}, {atHead, sHead, 1000, "1000"}, {behind, sBehind, 910, "910"}} {
		got, err := c.r.Load(f.ctx, c.s)
		if err != nil || got.State != want || got.Version != wantVersion || got.FromSnapshot != c.from {
			b.Fatalf("%s: %+v, %v; want version %d from snapshot %s, state %+v", c.s, got, err, wantVersion, c.fromLabel, want)
		}
	}

	// The store's stream read with the same type-switch fold: what is left
	// once the aggregate layer (snapshot lookup, fold dispatch) is taken away.
	readStream := func() {
		events, err := f.store.ReadStream(f.ctx, s, postgres.StreamQuery{})
		if err != nil {
			b.Fatal(err)
		}
		if model(events) != want {
			b.Fatal("store read folds to a different state")
		}
	}

	var rawTime, readTime, loadTime, headTime, behindTime time.Duration
	measure := func(total *time.Duration, load func()) {
		start := time.Now()
		load()
		*total += time.Since(start)
	}
	mustLoad := func(r *aggregate.Repository[Ticket], s projector.StreamRef) func() {
		return func() {
			if _, err := r.Load(f.ctx, s); err != nil {
				b.Fatal(err)
			}
		}
	}
	for b.Loop() {
		measure(&rawTime, func() { raw() })
		measure(&readTime, readStream)
		measure(&loadTime, mustLoad(plain, s))
		measure(&headTime, mustLoad(atHead, sHead))
		measure(&behindTime, mustLoad(behind, sBehind))
	}
	n := float64(b.N)
	us := func(d time.Duration) float64 { return float64(d.Microseconds()) / n }
	b.ReportMetric(us(rawTime), "raw-µs/load")
	b.ReportMetric(us(readTime), "read-stream-µs/load")
	b.ReportMetric(us(loadTime), "load-µs/load")
	b.ReportMetric(us(headTime), "snapshot-at-head-µs/load")
	b.ReportMetric(us(behindTime), "snapshot-90-behind-µs/load")
	b.ReportMetric(100*rawTime.Seconds()/loadTime.Seconds(), "load-%-of-raw")
}
