package search_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/cli"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/search"
	"github.com/projectorhq/projector/stores/postgres"
)

// partitionOf is the partition of 4 acme's ticket stream id lives in.
func partitionOf(id string) int { return int(postgres.StreamHash("acme", "ticket", id) >> 30) }

// TestVerifyPartitioned: a search projection with four partitions, indexed
// by a dispatcher while two writers append, verifies clean on each backend;
// with one partition held (disabled) behind the others, so the partitions'
// cursors differ, it still verifies clean — a document is expected as of
// its own stream's partition's cursor, and the held partition's newer
// event is not in the index yet — and a document tampered with in another
// partition fails verification, named.
func TestVerifyPartitioned(t *testing.T) {
	for _, bc := range backends() {
		t.Run(bc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			must(t, e.store.CreatePartitionIndex(e.ctx))
			b := bc.make(e)
			p := e.ticketProjection("ticket_search", b, projection.AsyncConfig{BatchSize: 20, Partitions: 4})
			d := e.dispatcher(p)

			// Two writers on their own streams (even and odd ids) while the
			// dispatcher indexes; no delete-by-filter, whose effect spans
			// partitions.
			var wg sync.WaitGroup
			errs := make(chan error, 2)
			for w := range 2 {
				wg.Go(func() {
					rng := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
					for range 40 {
						id := fmt.Sprintf("T-%d", 2*rng.IntN(20)+w)
						payloads := []any{testevents.TicketOpened{Title: "printer " + id, Customer: "acme"}}
						switch rng.IntN(4) {
						case 0:
							payloads = append(payloads, testevents.TicketClosed{})
						case 1:
							payloads = append(payloads, testevents.TicketClosed{Reason: "delete"})
						default:
							payloads = append(payloads, testevents.TicketCommented{Body: "jammed", N: rng.IntN(50)})
						}
						err := pgx.BeginFunc(e.ctx, e.store.Pool(), func(tx pgx.Tx) error {
							_, err := e.store.Append(e.ctx, tx, projector.TenantStream("acme", "ticket", id), projector.AnyVersion, payloads...)
							return err
						})
						if err != nil {
							errs <- err
							return
						}
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			e.catchUp(d)
			report, err := search.Verify(e.ctx, e.store, p, search.VerifyOptions{})
			must(t, err)
			if !report.OK() || report.Expected == 0 || report.Compared != report.Expected || len(report.Partitions) != 4 {
				t.Fatalf("verify of a partitioned index built from the log: %+v", report)
			}

			// Hold one partition behind: its stream's newest event is in the
			// log and past every other partition's cursor, but not indexed.
			held, other := "", ""
			for i := 0; held == "" || other == ""; i++ {
				id := fmt.Sprintf("H-%d", i)
				if partitionOf(id) == 0 && held == "" {
					held = id
				} else if partitionOf(id) != 0 && other == "" {
					other = id
				}
			}
			e.append("acme", held, testevents.TicketOpened{Title: "held before"})
			e.catchUp(d)
			admin := projection.NewAdmin(e.store)
			part0 := projection.ShardID{Consumer: "ticket_search", Instance: projection.PartitionInstance(0, 4)}
			must(t, admin.Disable(e.ctx, part0))
			e.append("acme", held, testevents.TicketCommented{Body: "not indexed yet", N: 1})
			e.append("acme", other, testevents.TicketOpened{Title: "other"})
			e.catchUp(d)
			report, err = search.Verify(e.ctx, e.store, p, search.VerifyOptions{})
			must(t, err)
			if !report.OK() || len(report.Partitions) != 4 {
				t.Fatalf("verify with partition 0/4 held behind: %+v", report)
			}
			behind := report.Partitions[0]
			if behind.Partition != "0/4" || !behind.Cursor.Less(report.Partitions[1].Cursor) && !behind.Cursor.Less(report.Partitions[2].Cursor) && !behind.Cursor.Less(report.Partitions[3].Cursor) {
				t.Fatalf("partition 0/4 is not behind the others: %+v", report.Partitions)
			}

			// Tamper with the document of a stream in another partition.
			raw := func(v any) json.RawMessage { return mustJSON(t, v) }
			plant := []search.Op{{Kind: search.OpPatch, Tenant: "acme", ID: other, Doc: map[string]json.RawMessage{"title": raw("tampered")}}}
			must(t, pgx.BeginFunc(e.ctx, e.store.Pool(), func(tx pgx.Tx) error { return b.Apply(e.ctx, tx, ticketIndex, plant) }))
			report, err = search.Verify(e.ctx, e.store, p, search.VerifyOptions{PageSize: 7})
			must(t, err)
			if report.OK() || len(report.Differences) != 1 || report.Differences[0].ID != other || report.Differences[0].Kind != search.Differs {
				t.Fatalf("verify after tampering with acme/%s: OK %v, differences %+v", other, report.OK(), report.Differences)
			}
			// The command says so, with each partition's cursor.
			async, err := p.Async()
			must(t, err)
			root := cli.New(cli.Config{Registry: e.types.Registry, Wire: func(string) (cli.Wiring, error) {
				return cli.Wiring{Async: []*projection.Async{async}}, nil
			}})
			var out bytes.Buffer
			root.SetOut(&out)
			root.SetErr(&out)
			root.SetArgs([]string{"search", "verify", "ticket_search", "--database-url", pgtest.URL(t), "--schema", e.store.Schema()})
			if err := root.ExecuteContext(e.ctx); cli.ExitCode(err) != cli.ExitError || !strings.Contains(out.String(), "at partition cursors 0/4 ") ||
				!strings.Contains(out.String(), "differs  acme/"+other) {
				t.Fatalf("search verify after tampering: %v\n%s", err, out.String())
			}
			must(t, admin.Enable(e.ctx, part0))
		})
	}
}

// TestVerifyPartitionedByKey: a search projection partitioned by a key of
// the event's own (AsyncConfig.PartitionKey) places each event by the key's
// hash, not its stream's: with the partition holding one stream's key held
// behind (while that stream's own hash falls in the other partition), verify
// expects that stream's newest event only after its key's partition's
// cursor, and passes.
func TestVerifyPartitionedByKey(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	b := backends()[0].make(e)
	key := func(ev projector.Event) (string, error) { return "k-" + ev.Stream.ID, nil }
	p := e.ticketProjection("ticket_search", b, projection.AsyncConfig{Partitions: 2, PartitionKey: key})
	d := e.dispatcher(p)
	half := func(h uint32) int { return int(h >> 31) }
	held := ""
	for i := 0; held == ""; i++ {
		id := fmt.Sprintf("K-%d", i)
		if kp := half(projection.KeyHash("acme", "ticket_search", "k-"+id)); kp == 0 && half(postgres.StreamHash("acme", "ticket", id)) != kp {
			held = id
		}
	}
	for i := range 10 {
		e.append("acme", fmt.Sprintf("T-%d", i), testevents.TicketOpened{Title: "open"})
	}
	e.append("acme", held, testevents.TicketOpened{Title: "held before"})
	e.catchUp(d)
	admin := projection.NewAdmin(e.store)
	must(t, admin.Disable(e.ctx, projection.ShardID{Consumer: "ticket_search", Instance: projection.PartitionInstance(0, 2)}))
	e.append("acme", held, testevents.TicketCommented{Body: "not indexed yet", N: 1})
	e.append("acme", "T-1", testevents.TicketCommented{Body: "indexed", N: 2})
	e.catchUp(d)
	report, err := search.Verify(e.ctx, e.store, p, search.VerifyOptions{})
	must(t, err)
	if !report.OK() || len(report.Partitions) != 2 || report.Expected != 11 {
		t.Fatalf("verify of a projection partitioned by key, partition 0/2 held: %+v", report)
	}
}
