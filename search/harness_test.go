package search_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/search"
	"github.com/projectorhq/projector/stores/postgres"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(runChild())
	}
	if os.Getenv(forgetChildEnv) != "" {
		os.Exit(runForgetChild())
	}
	pgtest.Main(m)
}

// ticketDoc is the document the test projection keeps per ticket.
type ticketDoc struct {
	ID       string `json:"id"`
	Title    string `json:"title"`
	Customer string `json:"customer,omitempty"`
	Status   string `json:"status,omitempty"`
	Comments int    `json:"comments,omitempty"`
	Last     string `json:"last,omitempty"`
}

var ticketIndex = search.Index{
	Name:       "tickets",
	Searchable: []string{"title", "last"},
	Filterable: []string{"status", "customer"},
	Sortable:   []string{"comments"},
}

// env is one test's schema, store and event types.
type env struct {
	t     testing.TB
	ctx   context.Context
	types testevents.Types
	store *postgres.Store
}

func newEnv(t testing.TB) *env {
	t.Helper()
	types := testevents.New()
	return &env{t: t, ctx: context.Background(), types: types, store: pgtest.Store(t, types.Registry)}
}

// ticketProjection maps the test vocabulary to index operations (see
// newTicketProjection) and ensures the index.
func (e *env) ticketProjection(name string, b search.Backend, cfg projection.AsyncConfig) *search.Projection {
	e.t.Helper()
	p, err := newTicketProjection(e.types, name, b, cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	if err := p.Ensure(e.ctx); err != nil {
		e.t.Fatal(err)
	}
	return p
}

// newTicketProjection maps the test vocabulary to index operations: opened
// upserts a whole document, commented patches two attributes, closed
// patches the status, deletes the ticket (reason "delete") or deletes
// every ticket of a customer (reason "purge:<customer>").
func newTicketProjection(types testevents.Types, name string, b search.Backend, cfg projection.AsyncConfig) (*search.Projection, error) {
	p := search.New(name, search.Config{Index: ticketIndex, Backend: b, Async: cfg})
	errs := []error{
		search.On(p, types.Opened, func(_ context.Context, ev projector.Event, o testevents.TicketOpened, w *search.Writer) error {
			return w.Upsert(ticketDoc{ID: ev.Stream.ID, Title: o.Title, Customer: o.Customer, Status: "open"})
		}),
		search.On(p, types.Commented, func(_ context.Context, ev projector.Event, c testevents.TicketCommented, w *search.Writer) error {
			if c.Body == "poison" {
				return w.Upsert(map[string]any{"title": "a document without its id"})
			}
			return w.Patch(ev.Stream.ID, map[string]any{"comments": c.N, "last": c.Body})
		}),
		search.On(p, types.Closed, func(_ context.Context, ev projector.Event, c testevents.TicketClosed, w *search.Writer) error {
			switch {
			case c.Reason == "delete":
				return w.Delete(ev.Stream.ID)
			case strings.HasPrefix(c.Reason, "purge:"):
				return w.DeleteWhere(search.Eq("customer", strings.TrimPrefix(c.Reason, "purge:")))
			}
			return w.Patch(ev.Stream.ID, map[string]any{"status": "closed"})
		}),
	}
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return p, nil
}

// dispatcher starts a dispatcher running the search projections.
func (e *env) dispatcher(ps ...*search.Projection) *projection.Dispatcher {
	e.t.Helper()
	return e.dispatcherOn(e.store, "", ps...)
}

// dispatcherOn starts a dispatcher on store (its own pool, for a second
// "process") with instance id instance ("" for a random one).
func (e *env) dispatcherOn(store *postgres.Store, instance string, ps ...*search.Projection) *projection.Dispatcher {
	e.t.Helper()
	var asyncs []*projection.Async
	for _, p := range ps {
		a, err := p.Async()
		if err != nil {
			e.t.Fatal(err)
		}
		asyncs = append(asyncs, a)
	}
	d, err := projection.New(projection.Config{Store: store, InstanceID: instance, Projections: asyncs, PollMax: 50 * time.Millisecond,
		Recheck: 50 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(tWriter{e.t}, &slog.HandlerOptions{Level: slog.LevelInfo}))})
	if err != nil {
		e.t.Fatal(err)
	}
	if err := d.Start(e.ctx); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := d.Stop(ctx); err != nil {
			e.t.Errorf("stop: %v", err)
		}
	})
	return d
}

func (e *env) catchUp(d *projection.Dispatcher) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.ctx, 60*time.Second)
	defer cancel()
	if err := d.CatchUp(ctx); err != nil {
		e.t.Fatal(err)
	}
}

// append appends payloads to tenant's ticket stream id.
func (e *env) append(tenant, id string, payloads ...any) {
	e.t.Helper()
	err := pgx.BeginFunc(e.ctx, e.store.Pool(), func(tx pgx.Tx) error {
		_, err := e.store.Append(e.ctx, tx, projector.TenantStream(tenant, "ticket", id), projector.AnyVersion, payloads...)
		return err
	})
	if err != nil {
		e.t.Fatalf("append to %s/%s: %v", tenant, id, err)
	}
}

// model is what the index should hold, tenant → id → document, folded
// from the same events with the documented semantics of each operation.
type model map[string]map[string]map[string]any

func (m model) apply(tenant, id string, payload any) {
	docs := m[tenant]
	if docs == nil {
		docs = map[string]map[string]any{}
		m[tenant] = docs
	}
	patch := func(fields map[string]any) {
		d := docs[id]
		if d == nil {
			d = map[string]any{"id": id}
			docs[id] = d
		}
		maps.Copy(d, fields)
	}
	switch p := payload.(type) {
	case testevents.TicketOpened:
		d := map[string]any{"id": id, "title": p.Title, "status": "open"}
		if p.Customer != "" {
			d["customer"] = p.Customer
		}
		docs[id] = d
	case testevents.TicketCommented:
		patch(map[string]any{"comments": p.N, "last": p.Body})
	case testevents.TicketClosed:
		switch {
		case p.Reason == "delete":
			delete(docs, id)
		case strings.HasPrefix(p.Reason, "purge:"):
			maps.DeleteFunc(docs, func(_ string, d map[string]any) bool { return d["customer"] == strings.TrimPrefix(p.Reason, "purge:") })
		default:
			patch(map[string]any{"status": "closed"})
		}
	}
}

// canonical renders the model as sorted "tenant/id {json}" lines.
func (m model) canonical(t testing.TB) []string {
	var out []string
	for tenant, docs := range m {
		for id, d := range docs {
			out = append(out, tenant+"/"+id+" "+canonicalJSON(t, mustJSON(t, d)))
		}
	}
	slices.Sort(out)
	return out
}

// history appends a random history over streams per tenant in tenants and
// folds it into m, which it returns. Stream ids repeat across tenants, so
// a tenant mix-up shows.
func (e *env) history(rng *rand.Rand, m model, tenants []string, streams, events int) model {
	e.t.Helper()
	open := map[string]bool{}
	customers := []string{"acme", "globex", "initech"}
	words := []string{"printer", "jammed", "laptop", "battery", "network", "slow", "invoice", "wrong"}
	for n := 0; n < events; {
		tenant := tenants[rng.IntN(len(tenants))]
		id := fmt.Sprintf("T-%d", rng.IntN(streams))
		key := tenant + "/" + id
		var payloads []any
		for range 1 + rng.IntN(3) {
			var p any
			switch r := rng.IntN(20); {
			case !open[key] || r == 0:
				p = testevents.TicketOpened{Title: words[rng.IntN(len(words))] + " " + words[rng.IntN(len(words))] + " " + id,
					Customer: customers[rng.IntN(len(customers))]}
				open[key] = true
			case r < 14:
				p = testevents.TicketCommented{Body: words[rng.IntN(len(words))], N: 1 + rng.IntN(50)}
			case r < 17:
				p = testevents.TicketClosed{}
			case r < 19:
				p = testevents.TicketClosed{Reason: "delete"}
				open[key] = false
			default:
				p = testevents.TicketClosed{Reason: "purge:" + customers[rng.IntN(len(customers))]}
			}
			payloads = append(payloads, p)
		}
		e.append(tenant, id, payloads...)
		for _, p := range payloads {
			m.apply(tenant, id, p)
		}
		n += len(payloads)
	}
	return m
}

// indexed lists what b holds of the ticket index, in the model's form.
func indexed(t testing.TB, ctx context.Context, b search.Backend) []string {
	t.Helper()
	docs, err := b.(search.Lister).Documents(ctx, ticketIndex)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]string, 0, len(docs))
	for _, d := range docs {
		out = append(out, d.Tenant+"/"+d.ID+" "+canonicalJSON(t, d.Doc))
	}
	slices.Sort(out)
	return out
}

// sameIndex fails the test with the first differences between want and got.
func sameIndex(t testing.TB, what string, want, got []string) {
	t.Helper()
	if slices.Equal(want, got) {
		return
	}
	w, g := map[string]bool{}, map[string]bool{}
	for _, s := range want {
		w[s] = true
	}
	for _, s := range got {
		g[s] = true
	}
	var diff []string
	for _, s := range want {
		if !g[s] {
			diff = append(diff, "missing: "+s)
		}
	}
	for _, s := range got {
		if !w[s] {
			diff = append(diff, "extra:   "+s)
		}
	}
	t.Fatalf("%s: index has %d documents, want %d; differences (first 10):\n%s", what, len(got), len(want), strings.Join(diff[:min(len(diff), 10)], "\n"))
}

func canonicalJSON(t testing.TB, b []byte) string {
	t.Helper()
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("decode %s: %v", b, err)
	}
	return string(mustJSON(t, v))
}

func mustJSON(t testing.TB, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
