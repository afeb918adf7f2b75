package console_test

import (
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/projection"
)

// A partitioned consumer shows as one row with its partitions under it,
// in partition order: each with its cursor, lag, owner instance and rate,
// and the hot one (a stream far busier than the rest) marked with its
// skew, which the consumer's row counts; partitions a merge holds (here one
// killed after it set its holds) say where. The consumer's row (the fence)
// offers no transition, which it would refuse, but the rebuild; a
// partition's buttons act on that partition. An owner name holding markup
// is shown as text.
func TestBrowserPartitionsUnderConsumer(t *testing.T) {
	e := newEnv(t, options{token: testToken, partitions: 4})
	stop := e.dispatch()
	e.appendEvents("hot", 300)
	for i := range 40 {
		e.appendEvents("calm-"+strconv.Itoa(i), 2)
	}
	var bucket int
	if err := e.store.Pool().QueryRow(e.ctx, `SELECT `+e.store.Schema()+`.projector_stream_bucket(tenant_id, stream_type, stream_id) FROM `+
		e.store.Table("projector_events")+` WHERE stream_id = 'hot' LIMIT 1`).Scan(&bucket); err != nil {
		t.Fatal(err)
	}
	hot := bucket / 16
	pgtest.Eventually(t, time.Minute, "every event applied", func() bool {
		shards, err := e.admin.List(e.ctx, "tickets")
		if err != nil {
			return false
		}
		var n int64
		for _, s := range shards {
			n += s.Processed
		}
		return n == 380
	})
	stop()
	const hostile = `<img src=x onerror="window.pwned=1">`
	if _, err := e.store.Pool().Exec(e.ctx, `UPDATE `+e.store.Table("projector_consumers")+` SET owner = $2 WHERE name = 'tickets' AND instance_id = $1`,
		projection.PartitionInstance(3, 4), hostile); err != nil {
		t.Fatal(err)
	}
	if _, err := e.store.Pool().Exec(e.ctx, `UPDATE `+e.store.Table("projector_consumers")+` SET hold_tx_id = cursor_tx_id, hold_seq = cursor_seq
		WHERE name = 'tickets' AND instance_id = ANY($1)`, []string{projection.PartitionInstance(2, 4), projection.PartitionInstance(3, 4)}); err != nil {
		t.Fatal(err)
	}
	holds := map[int]string{}
	shards, err := e.admin.List(e.ctx, "tickets")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range shards {
		if s.Held {
			holds[s.Partition] = s.Hold.String()
			if s.Hold.Seq == math.MaxInt64 {
				holds[s.Partition] = strconv.FormatUint(s.Hold.TxID, 10) + "/max" // as the cursor column writes a horizon
			}
		}
	}
	if len(holds) != 2 {
		t.Fatalf("holds set on %v, want partitions 2 and 3", holds)
	}

	b := newBrowser(t, 1280, 900)
	b.do("sign in", 30*time.Second,
		chromedp.Navigate(e.srv.URL+"/login"),
		chromedp.SendKeys(chromedp.CSS(`input[name="token"]`), testToken),
		chromedp.Click(chromedp.ID("login")),
		chromedp.WaitVisible(chromedp.ID("operator")),
	)
	b.do("partitions shown", time.Minute, chromedp.WaitVisible(chromedp.CSS(`tr.shard.part[data-consumer="tickets"][data-partition="3"]`)))
	order := eval[[]string](b, `[...document.querySelectorAll('tr.shard[data-consumer="tickets"]')].map(r => r.dataset.partition ?? "consumer")`)
	if strings.Join(order, ",") != "consumer,0,1,2,3" {
		t.Errorf("rows of tickets in the order %v, want the consumer, then partitions 0 to 3", order)
	}
	consumer := `tr.shard.parted[data-consumer="tickets"]`
	if got := eval[string](b, `document.querySelector('`+consumer+` td[data-label="Consumer"]').textContent`); !strings.Contains(got, "4 partitions") || !strings.Contains(got, "1 hot") {
		t.Errorf("consumer row says %q, want 4 partitions, 1 hot", got)
	}
	if got := eval[string](b, `document.querySelector('`+consumer+`').dataset.state`); got != "partitioned" {
		t.Errorf("consumer row in state %q, want partitioned (not its fence's disabled)", got)
	}
	if got := eval[string](b, `document.querySelector('`+consumer+` td[data-label="Processed"]').textContent`); got != "380" {
		t.Errorf("consumer row processed %q, want the partitions' 380", got)
	}
	if ops := eval[[]string](b, `[...document.querySelectorAll('`+consumer+` button[data-op]')].map(b => b.dataset.op)`); strings.Join(ops, ",") != "request" {
		t.Errorf("consumer row offers %v, want only the rebuild", ops)
	}
	for p := range 4 {
		sel := `tr.shard.part[data-consumer="tickets"][data-partition="` + strconv.Itoa(p) + `"]`
		text := eval[string](b, `document.querySelector('`+sel+`').textContent`)
		isHot := eval[bool](b, `!!document.querySelector('`+sel+` .hot')`)
		if isHot != (p == hot) {
			t.Errorf("partition %d marked hot: %v (the hot stream is in %d): %q", p, isHot, hot, text)
		}
		for _, want := range []string{"partition " + strconv.Itoa(p) + "/4", "owner", "skew", "/s"} {
			if !strings.Contains(text, want) {
				t.Errorf("partition %d row lacks %q: %q", p, want, text)
			}
		}
		held := eval[string](b, `(document.querySelector('`+sel+` .held') || {}).textContent || ""`)
		if want, ok := holds[p]; ok && held != "held at "+want+" (merge)" {
			t.Errorf("partition %d held at %s shows %q, want \"held at %s (merge)\"", p, want, held, want)
		} else if !ok && held != "" {
			t.Errorf("partition %d, not held, shows %q", p, held)
		}
	}
	if got := eval[string](b, `document.querySelector('tr.shard.part[data-partition="3"] .owner').textContent`); !strings.Contains(got, hostile) {
		t.Errorf("owner shown as %q, want the text %s", got, hostile)
	}
	if n := eval[int](b, `document.querySelectorAll('#consumers img').length + (window.pwned ? 1 : 0)`); n != 0 {
		t.Error("an owner's markup became an element of the page")
	}
	_ = eval[bool](b, `window.confirm = () => true, true`)
	b.do("disable partition 1", 10*time.Second, chromedp.Click(chromedp.CSS(`tr.shard.part[data-partition="1"] button[data-op="disable"]`)))
	b.do("partition 1 disabled", 30*time.Second, chromedp.WaitVisible(chromedp.CSS(`tr.shard.part[data-partition="1"][data-state="disabled"]`)))
	st, err := e.admin.Status(e.ctx, projection.ShardID{Consumer: "tickets", Instance: projection.PartitionInstance(1, 4)})
	if err != nil || st.Status != projection.StatusDisabled {
		t.Errorf("partition 1 after disable from the page: %v, %v", st.Status, err)
	}
	if st, err := e.admin.Status(e.ctx, projection.ShardID{Consumer: "tickets", Instance: projection.PartitionInstance(2, 4)}); err != nil || st.Status != projection.StatusIdle {
		t.Errorf("partition 2 after disabling partition 1: %v, %v", st.Status, err)
	}
}
