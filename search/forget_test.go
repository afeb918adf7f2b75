package search_test

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/search"
	"github.com/projectorhq/projector/stores/meilisearch"
	"github.com/projectorhq/projector/stores/meilisearch/meilisearchtest"
	"github.com/projectorhq/projector/stores/pgsearch"
	"github.com/projectorhq/projector/stores/postgres"
)

// The forget child is this test binary run as a dispatcher of the customer
// read model and both customer search projections.
const (
	forgetChildEnv    = "PROJECTOR_TEST_FORGET_CHILD"
	forgetChildSchema = "PROJECTOR_TEST_FORGET_CHILD_SCHEMA"
	forgetChildMeili  = "PROJECTOR_TEST_FORGET_CHILD_MEILI"
)

var customerIndex = search.Index{Name: "customers", Searchable: []string{"name", "email"}, Filterable: []string{"customer"}}

type customerDoc struct {
	ID       string `json:"id"`
	Customer string `json:"customer"`
	Name     string `json:"name"`
	Email    string `json:"email"`
	Plan     string `json:"plan"`
}

// customerProjections are the read model (table name in the store's
// schema) and the search projections on pgsearch and Meilisearch, each
// forgetting subjects with its one-line helper.
func customerProjections(store *postgres.Store, types testevents.PersonalTypes, meiliURL string, tables ...string) ([]*projection.Async, []*search.Projection, error) {
	cfg := projection.AsyncConfig{BatchSize: 5, RetryBackoff: 5 * time.Millisecond, MaxBackoff: 50 * time.Millisecond, MaxAttempts: 1000}
	var asyncs []*projection.Async
	for _, table := range tables {
		a := projection.NewAsync(table, cfg)
		qt := pgx.Identifier{store.Schema(), table}.Sanitize()
		err := projection.On(a, types.Registered, func(ctx context.Context, tx pgx.Tx, ev projector.Event, c testevents.CustomerRegistered) error {
			_, err := tx.Exec(ctx, `INSERT INTO `+qt+` (tenant_id, id, customer, name, email, plan) VALUES ($1, $2, $3, $4, $5, $6)
				ON CONFLICT (tenant_id, id) DO UPDATE SET name = EXCLUDED.name, email = EXCLUDED.email, plan = EXCLUDED.plan`,
				ev.Stream.Tenant, ev.Stream.ID, c.Customer, c.Name, c.Email, c.Plan)
			return err
		})
		if err == nil {
			err = projection.OnForgotten(a, projection.ForgetRows{Table: store.Schema() + "." + table, SubjectColumn: "customer", TenantColumn: "tenant_id"})
		}
		if err != nil {
			return nil, nil, err
		}
		asyncs = append(asyncs, a)
	}
	pg, err := pgsearch.New(store, pgsearch.Config{})
	if err != nil {
		return nil, nil, err
	}
	meili, err := meilisearch.New(meilisearch.Config{URL: meiliURL, IndexPrefix: store.Schema() + "_", PollInterval: 2 * time.Millisecond})
	if err != nil {
		return nil, nil, err
	}
	var searches []*search.Projection
	for name, b := range map[string]search.Backend{"customers_pg": pg, "customers_meili": meili} {
		p := search.New(name, search.Config{Index: customerIndex, Backend: b, Async: cfg})
		err := search.On(p, types.Registered, func(_ context.Context, ev projector.Event, c testevents.CustomerRegistered, w *search.Writer) error {
			return w.Upsert(customerDoc{ID: ev.Stream.ID, Customer: c.Customer, Name: c.Name, Email: c.Email, Plan: c.Plan})
		})
		if err == nil {
			err = search.OnForgotten(p, "customer")
		}
		if err != nil {
			return nil, nil, err
		}
		a, err := p.Async()
		if err != nil {
			return nil, nil, err
		}
		asyncs = append(asyncs, a)
		searches = append(searches, p)
	}
	return asyncs, searches, nil
}

func forgetMaster() *postgres.MasterKey {
	m, err := postgres.NewMasterKey("p19", testevents.MasterKey("p19"))
	if err != nil {
		panic(err)
	}
	return m
}

// runForgetChild is the forget child's main: dispatch until SIGTERM (or
// SIGKILL).
func runForgetChild() int {
	ctx, stop := pgtest.ChildContext()
	defer stop()
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	fail := func(what string, err error) int {
		logger.Error("forget child: "+what, "error", err)
		return 1
	}
	pool, err := pgxpool.New(ctx, os.Getenv(childURLEnv))
	if err != nil {
		return fail("pool", err)
	}
	defer pool.Close()
	types := testevents.NewPersonal()
	store, err := postgres.New(ctx, pool, postgres.Config{Schema: os.Getenv(forgetChildSchema), Registry: types.Registry, Logger: logger, MasterKey: forgetMaster()})
	if err != nil {
		return fail("store", err)
	}
	asyncs, _, err := customerProjections(store, types, os.Getenv(forgetChildMeili), "customers")
	if err != nil {
		return fail("projections", err)
	}
	d, err := projection.New(projection.Config{Store: store, Projections: asyncs, Logger: logger, PollMax: 20 * time.Millisecond, Recheck: 20 * time.Millisecond})
	if err != nil {
		return fail("dispatcher", err)
	}
	if err := d.Start(ctx); err != nil {
		return fail("start", err)
	}
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_ = d.Stop(sctx)
	return 0
}

// TestPromise19_ForgottenMeansGone: writers append customers — among them
// the subject to forget — while a child dispatcher of a read model, a
// pgsearch and a Meilisearch (fake) index is SIGKILLed again and again;
// the subject is forgotten in the middle of it, its appends still going.
// Afterwards no raw row of the events table holds a personal field in the
// clear; the read model, a model rebuilt from the log, both indexes hold
// none of the forgotten subject's personal data; every other subject's
// row equals the fold of the log; and both indexes equal the log (Verify).
func TestPromise19_ForgottenMeansGone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	types := testevents.NewPersonal()
	store := pgtest.Store(t, types.Registry, postgres.Config{MasterKey: forgetMaster()})
	for _, table := range []string{"customers", "customers_rebuilt"} {
		if _, err := store.Pool().Exec(ctx, `CREATE TABLE `+pgx.Identifier{store.Schema(), table}.Sanitize()+` (
			tenant_id text, id text, customer text, name text, email text, plan text, PRIMARY KEY (tenant_id, id))`); err != nil {
			t.Fatal(err)
		}
	}
	meiliURL := meilisearchtest.New(t).URL()
	_, searches, err := customerProjections(store, types, meiliURL)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range searches {
		if err := p.Ensure(ctx); err != nil {
			t.Fatal(err)
		}
	}
	target := postgres.SubjectRef{Tenant: "acme", ID: "c-3"}
	personal := func(tenant, id string, n int) (name, email string) {
		return fmt.Sprintf("Name %s %s %d", tenant, id, n), fmt.Sprintf("mail-%s-%s-%d@example.com", tenant, id, n)
	}

	// Writers: every subject, the target included until its forget
	// returns (appends in flight then commit after it). Appending to it on
	// after would overwrite what a broken forget left behind with nulls
	// and hide it.
	// They share a pace of one append per 2 ms: flat out they wrote
	// ~17,000 events while the children were killed, and the last
	// dispatcher then spent half a minute under -race catching them up,
	// with nothing more to check than at a few thousand.
	var stop, gone atomic.Bool
	var wg sync.WaitGroup
	var appended atomic.Int64
	pace := time.NewTicker(2 * time.Millisecond)
	defer pace.Stop()
	for w := range 3 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
			for n := 0; !stop.Load(); n++ {
				<-pace.C
				tenant := []string{"acme", "globex"}[rng.IntN(2)]
				id := fmt.Sprintf("c-%d", rng.IntN(6))
				if tenant == target.Tenant && id == target.ID && gone.Load() {
					continue
				}
				name, email := personal(tenant, id, n)
				err := pgx.BeginFunc(ctx, store.Pool(), func(tx pgx.Tx) error {
					_, err := store.Append(ctx, tx, projector.TenantStream(tenant, "customer", id), projector.AnyVersion,
						testevents.CustomerRegistered{Customer: id, Name: name, Email: email, Plan: fmt.Sprint("p", n)})
					return err
				})
				if err != nil && !strings.Contains(err.Error(), "concurrent modification") {
					t.Errorf("append: %v", err)
					return
				}
				appended.Add(1)
			}
		})
	}
	env := []string{forgetChildEnv + "=1", childURLEnv + "=" + pgtest.URL(t), forgetChildSchema + "=" + store.Schema(), forgetChildMeili + "=" + meiliURL}
	rng := rand.New(rand.NewPCG(19, uint64(time.Now().UnixNano())))
	forgotten := false
	for kill := range 6 {
		child := pgtest.StartChild(t, env...)
		// Fault injection, not synchronisation: the kill lands at a random
		// moment of the child's work.
		time.Sleep(time.Duration(100+rng.IntN(300)) * time.Millisecond)
		if kill == 3 {
			// The forget must find the subject's data everywhere, or a
			// helper that forgets nothing would pass: stop the target's
			// profile stream and wait until the read model and both
			// indexes hold its last event.
			gone.Store(true)
			pgtest.Eventually(t, 30*time.Second, "the read model and both indexes hold the target's personal data", func() bool {
				return holdsLast(t, store, searches, target)
			})
			// Then forget it while its other stream is appended to.
			late := make(chan struct{})
			var lateWG sync.WaitGroup
			lateWG.Go(func() {
				for n := 0; ; n++ {
					select {
					case <-late:
						if n > 10 {
							return
						}
					default:
					}
					name, email := personal(target.Tenant, target.ID, 10000+n)
					err := pgx.BeginFunc(ctx, store.Pool(), func(tx pgx.Tx) error {
						_, err := store.Append(ctx, tx, projector.TenantStream(target.Tenant, "customer", target.ID+"-late"), projector.AnyVersion,
							testevents.CustomerRegistered{Customer: target.ID, Name: name, Email: email, Plan: "late"})
						return err
					})
					if err != nil {
						t.Errorf("late append: %v", err)
						return
					}
				}
			})
			_, err := store.Forget(ctx, target)
			close(late)
			lateWG.Wait()
			if err != nil {
				t.Fatal(err)
			}
			forgotten = true
		}
		child.Kill(t)
	}
	stop.Store(true)
	wg.Wait()
	if !forgotten || appended.Load() < 20 {
		t.Fatalf("forgotten %v after %d appends", forgotten, appended.Load())
	}

	// A last dispatcher runs to the end, with a model rebuilt from the
	// start of the log beside the live one.
	asyncs, _, err := customerProjections(store, types, meiliURL, "customers", "customers_rebuilt")
	if err != nil {
		t.Fatal(err)
	}
	d, err := projection.New(projection.Config{Store: store, Projections: asyncs, PollMax: 20 * time.Millisecond, Recheck: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() {
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if err := d.Stop(sctx); err != nil {
			t.Errorf("stop: %v", err)
		}
	}()
	cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := d.CatchUp(cctx); err != nil {
		t.Fatal(err)
	}

	// Every personal value of the target starts with one of these.
	leaks := func(what, text string) {
		t.Helper()
		for _, s := range []string{"Name acme c-3 ", "mail-acme-c-3-"} {
			if strings.Contains(text, s) {
				t.Fatalf("%s holds the forgotten subject's personal data: %s", what, text)
			}
		}
	}

	// Raw rows: nobody's personal data in the clear.
	rows, err := store.Pool().Query(ctx, `SELECT data::text FROM `+store.Table("projector_events"))
	if err != nil {
		t.Fatal(err)
	}
	raw, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	for _, data := range raw {
		if strings.Contains(data, "Name ") || strings.Contains(data, "@example.com") {
			t.Fatalf("raw event row holds personal data in the clear: %s", data)
		}
	}

	// The fold of the log, as every reader now reads it.
	want := map[string]testevents.CustomerRegistered{}
	for after := projector.Start; ; {
		b, err := store.ReadLog(ctx, postgres.LogQuery{After: after, EventTypes: []string{types.Registered.Name()}})
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range b.Events {
			c := ev.Payload.(testevents.CustomerRegistered)
			leaks("a log read", c.Name+c.Email)
			want[ev.Stream.Tenant+"/"+ev.Stream.ID] = c
		}
		if !b.Full {
			break
		}
		after = b.Events[len(b.Events)-1].Position
	}
	for _, table := range []string{"customers", "customers_rebuilt"} {
		rows, err := store.Pool().Query(ctx, `SELECT tenant_id, id, customer, coalesce(name, ''), coalesce(email, ''), plan FROM `+pgx.Identifier{store.Schema(), table}.Sanitize())
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]testevents.CustomerRegistered{}
		var tenant, id string
		var c testevents.CustomerRegistered
		if _, err := pgx.ForEachRow(rows, []any{&tenant, &id, &c.Customer, &c.Name, &c.Email, &c.Plan}, func() error {
			leaks(table, c.Name+c.Email)
			got[tenant+"/"+id] = c
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		for k, w := range want {
			g, ok := got[k]
			if strings.HasPrefix(k, "acme/c-3") {
				// Deleted by the forget, or written again since (null).
				if ok && (g.Name != "" || g.Email != "") {
					t.Fatalf("%s: %s holds %+v", table, k, g)
				}
				continue
			}
			if g != w {
				t.Fatalf("%s: %s is %+v, the log says %+v", table, k, g, w)
			}
		}
	}
	for _, p := range searches {
		docs, err := p.SearchBackend().(search.Lister).Documents(ctx, customerIndex)
		if err != nil {
			t.Fatal(err)
		}
		for _, doc := range docs {
			leaks(p.Name(), string(doc.Doc))
		}
		rep, err := search.Verify(ctx, store, p, search.VerifyOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if !rep.OK() {
			t.Fatalf("%s differs from the log: %+v", p.Name(), rep.Differences)
		}
	}
}

// holdsLast reports whether the read model and both indexes hold the
// target profile stream's last event, its personal data included.
func holdsLast(t *testing.T, store *postgres.Store, searches []*search.Projection, target postgres.SubjectRef) bool {
	ctx := context.Background()
	evs, err := store.ReadStream(ctx, projector.TenantStream(target.Tenant, "customer", target.ID), postgres.StreamQuery{})
	if err != nil || len(evs) == 0 {
		return false
	}
	last := evs[len(evs)-1].Payload.(testevents.CustomerRegistered)
	if last.Name == "" {
		t.Fatalf("the target's last event has no name: %+v", last)
	}
	var n int
	_ = store.Pool().QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{store.Schema(), "customers"}.Sanitize()+
		` WHERE tenant_id = $1 AND id = $2 AND name = $3`, target.Tenant, target.ID, last.Name).Scan(&n)
	if n != 1 {
		return false
	}
	for _, p := range searches {
		docs, err := p.SearchBackend().(search.Lister).Documents(ctx, customerIndex)
		if err != nil || !slices.ContainsFunc(docs, func(d search.Stored) bool {
			return d.Tenant == target.Tenant && d.ID == target.ID && strings.Contains(string(d.Doc), last.Name)
		}) {
			return false
		}
	}
	return true
}
