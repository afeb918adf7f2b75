package live_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/live"
)

// EnvLoad turns on TestLiveLoad, which runs for about half a minute.
const envLoad = "PROJECTOR_LIVE_LOAD"

// TestLiveLoad: 200 SSE clients on loopback (20 tenants × 10), writers
// appending 1,000 events/s for 10 s (1 kB payloads, sent; half of them to
// tenant t0), and one more client of t0 that stops reading. Every reading client must get every
// event of its tenant in order; the stalled one must be dropped. It prints
// the commit-to-browser latency beside raw PostgreSQL's LISTEN/NOTIFY
// measured on the same commits, and the heap before, at peak and after.
// Figures: docs/performance.md. Run: PROJECTOR_LIVE_LOAD=1 go test -run
// TestLiveLoad -v ./live/
func TestLiveLoad(t *testing.T) {
	if os.Getenv(envLoad) == "" {
		t.Skip("set " + envLoad + "=1 to run the live feed load test")
	}
	const (
		tenants   = 20
		perTenant = 10
		rate      = 1000 // events/s
		perTx     = 10
		duration  = 10 * time.Second
	)
	e := newEnv(t, live.Config{Payloads: true}, false)
	if out, err := exec.Command("uptime").Output(); err == nil {
		t.Logf("uptime: %s", strings.TrimSpace(string(out)))
	}
	heapBefore := heap()

	type recv struct {
		ids []string
		at  []time.Time
	}
	clients := make([]*sse, 0, tenants*perTenant)
	got := make([]recv, tenants*perTenant)
	for i := range tenants * perTenant {
		clients = append(clients, e.connect(fmt.Sprint("t", i%tenants), "", ""))
	}
	stalled := dialStalled(t, e.srv.URL, "t0", "")
	pgtest.Eventually(t, time.Minute, "every client live", func() bool { return e.feed.Clients() == tenants*perTenant+1 })

	// Raw PostgreSQL baseline: a LISTEN connection told of each commit.
	ctx, cancel := context.WithCancel(e.ctx)
	defer cancel()
	lconn, err := pgx.ConnectConfig(ctx, pgtest.ConnConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	defer lconn.Close(context.WithoutCancel(ctx))
	channel := "live_load_" + strings.Trim(e.store.Schema(), `"`)
	if _, err := lconn.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	committed := map[string]time.Time{} // position of a tx's last event → commit returned
	notified := map[string]time.Time{}
	listenDone := make(chan struct{})
	go func() {
		defer close(listenDone)
		for {
			n, err := lconn.WaitForNotification(ctx)
			if err != nil {
				return
			}
			at := time.Now()
			mu.Lock()
			notified[n.Payload] = at
			mu.Unlock()
		}
	}()

	var readers sync.WaitGroup
	var gmu sync.Mutex // guards got
	for i, c := range clients {
		readers.Go(func() {
			for m := range c.msgs {
				if m.id != "" {
					at := time.Now()
					gmu.Lock()
					got[i].ids = append(got[i].ids, m.id)
					got[i].at = append(got[i].at, at)
					gmu.Unlock()
				}
			}
		})
	}
	var peak uint64
	sampleDone := make(chan struct{})
	go func() {
		defer close(sampleDone)
		tk := time.NewTicker(100 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tk.C:
				var ms runtime.MemStats
				runtime.ReadMemStats(&ms)
				peak = max(peak, ms.HeapAlloc)
			}
		}
	}()

	// Writers: eight goroutines, each a transaction of perTx events every
	// 80 ms.
	body := strings.Repeat("x", 1000)
	start := time.Now()
	var writers sync.WaitGroup
	const writerN = 8
	for w := range writerN {
		writers.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			// Paced, not ticked: a transaction that comes late is made up
			// at once, so the run appends exactly rate × duration events.
			every := time.Duration(writerN*perTx) * time.Second / rate
			for n := range int(duration / every) {
				if d := time.Until(start.Add(time.Duration(n) * every)); d > 0 {
					tm := time.NewTimer(d)
					<-tm.C
				}
				// Half the events go to t0, the stalled client's tenant,
				// so its socket buffers fill (a few MB on loopback)
				// within the run; the rest spread over t1…t19.
				tenant := "t0"
				if rng.IntN(2) == 1 {
					tenant = fmt.Sprint("t", 1+rng.IntN(tenants-1))
				}
				ref := projector.TenantStream(tenant, "ticket", fmt.Sprintf("w%d-%d", w, rng.IntN(50)))
				payloads := make([]any, perTx)
				for j := range payloads {
					payloads[j] = testevents.TicketCommented{Body: body, N: j}
				}
				var pos string
				err := pgx.BeginFunc(ctx, e.store.Pool(), func(tx pgx.Tx) error {
					res, err := e.store.Append(ctx, tx, ref, projector.AnyVersion, payloads...)
					if err != nil {
						return err
					}
					last := res.Events[len(res.Events)-1].Position
					e.appended(last)
					pos = last.String()
					_, err = tx.Exec(ctx, "SELECT pg_notify($1, $2)", channel, pos)
					return err
				})
				if err != nil {
					t.Error(err)
					return
				}
				at := time.Now()
				mu.Lock()
				committed[pos] = at
				mu.Unlock()
			}
		})
	}
	writers.Wait()
	elapsed := time.Since(start)

	// Every reading client gets every event of its tenant, in order.
	wants := make([][]string, tenants)
	total := 0
	for i := range tenants {
		wants[i] = e.logIDs(fmt.Sprint("t", i), nil, projector.Start)
		total += len(wants[i])
	}
	pgtest.Eventually(t, time.Minute, "every client to get every event", func() bool {
		gmu.Lock()
		defer gmu.Unlock()
		for i := range clients {
			if len(got[i].ids) < len(wants[i%tenants]) {
				return false
			}
		}
		return true
	})
	for _, c := range clients {
		c.close()
	}
	readers.Wait()
	for i := range clients {
		sameIDs(t, fmt.Sprintf("client %d (tenant t%d)", i, i%tenants), got[i].ids, wants[i%tenants])
	}
	// The stalled client was dropped (it is no longer a client), the others
	// were not.
	pgtest.Eventually(t, time.Minute, "the stalled client dropped", func() bool { return e.feed.Clients() == 0 })
	stalled.conn.Close()
	cancel()
	<-listenDone
	<-sampleDone
	heapPeak := peak

	// Latency from the writer's commit returning to the browser, for the
	// transaction's last event, beside LISTEN/NOTIFY for the same commit.
	var ours, raw, hot []time.Duration
	mu.Lock()
	for i := range clients {
		for k, id := range got[i].ids {
			if c, ok := committed[id]; ok {
				ours = append(ours, got[i].at[k].Sub(c))
				if i%tenants == 0 {
					hot = append(hot, got[i].at[k].Sub(c))
				}
			}
		}
	}
	for pos, c := range committed {
		if n, ok := notified[pos]; ok {
			raw = append(raw, n.Sub(c))
		}
	}
	mu.Unlock()
	heapAfter := heap()
	t.Logf("%d events in %v (%.0f/s) to %d clients (%d deliveries)", total, elapsed.Round(time.Millisecond), float64(total)/elapsed.Seconds(), len(clients), len(ours)*perTx)
	t.Logf("commit → SSE client:   p50 %v  p99 %v  max %v  (%d samples)", pct(ours, 50), pct(ours, 99), pct(ours, 100), len(ours))
	t.Logf("  of which t0's readers (beside the stalled client): p50 %v  p99 %v  max %v", pct(hot, 50), pct(hot, 99), pct(hot, 100))
	t.Logf("commit → LISTEN/NOTIFY: p50 %v  p99 %v  max %v  (%d samples, raw PostgreSQL baseline)", pct(raw, 50), pct(raw, 99), pct(raw, 100), len(raw))
	t.Logf("heap: before %s, peak %s, after %s", mb(heapBefore), mb(heapPeak), mb(heapAfter))
	res, _ := json.Marshal(map[string]any{"events": total, "clients": len(clients), "p50_ms": ms(pct(ours, 50)), "p99_ms": ms(pct(ours, 99)),
		"notify_p50_ms": ms(pct(raw, 50)), "notify_p99_ms": ms(pct(raw, 99)), "heap_before": heapBefore, "heap_peak": heapPeak, "heap_after": heapAfter})
	t.Logf("result %s", res)
}

func heap() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

func pct(d []time.Duration, p int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	i := min(len(s)-1, len(s)*p/100)
	return s[i].Round(100 * time.Microsecond)
}

func mb(b uint64) string { return fmt.Sprintf("%.1f MB", float64(b)/(1<<20)) }

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
