package aggregate_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/aggregate"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/stores/postgres"
)

// The examples' events: a shopping cart.
type (
	ItemAdded struct {
		SKU   string `json:"sku"`
		Cents int    `json:"cents"`
	}
	CartCheckedOut struct{}
)

// Cart is the examples' aggregate state: a plain struct, JSON-able for
// snapshots.
type Cart struct {
	Items      []string `json:"items"`
	TotalCents int      `json:"total_cents"`
	CheckedOut bool     `json:"checked_out"`
}

var errCheckedOut = errors.New("cart is already checked out")

// addItem is a command: it refuses a checked-out cart.
func addItem(sku string, cents int) aggregate.Decide[Cart] {
	return func(_ context.Context, cart aggregate.Loaded[Cart]) ([]any, error) {
		if cart.State.CheckedOut {
			return nil, errCheckedOut
		}
		return []any{ItemAdded{SKU: sku, Cents: cents}}, nil
	}
}

// newCarts defines the cart events and aggregate on a store of its own, as
// Example does step by step. Close the store's pool when done.
func newCarts(snapshots aggregate.Snapshots) (*aggregate.Repository[Cart], *postgres.Store) {
	ctx := context.Background()
	url, schema := pgtest.ExampleDatabase()
	reg := projector.NewRegistry()
	itemAdded := projector.MustDefine[ItemAdded](reg, "cart.item_added")
	cartCheckedOut := projector.MustDefine[CartCheckedOut](reg, "cart.checked_out")
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		panic(err)
	}
	if _, err := postgres.Migrate(ctx, pool, schema); err != nil {
		panic(err)
	}
	store, err := postgres.New(ctx, pool, postgres.Config{Schema: schema, Registry: reg})
	if err != nil {
		panic(err)
	}
	carts, err := aggregate.New(store, aggregate.Config[Cart]{
		Name: "cart",
		Folds: []aggregate.Fold[Cart]{
			aggregate.On(itemAdded, func(c *Cart, e ItemAdded) {
				c.Items = append(c.Items, e.SKU)
				c.TotalCents += e.Cents
			}),
			aggregate.On(cartCheckedOut, func(c *Cart, _ CartCheckedOut) { c.CheckedOut = true }),
		},
		Snapshots: snapshots,
	})
	if err != nil {
		panic(err)
	}
	return carts, store
}

func Example() {
	ctx := context.Background()
	// An application reads these from its configuration:
	// os.Getenv("PROJECTOR_DATABASE_URL") and its schema ("projector").
	url, schema := pgtest.ExampleDatabase()

	// At start-up: the event types, the pool, the schema, the store, the
	// aggregate.
	reg := projector.NewRegistry()
	itemAdded := projector.MustDefine[ItemAdded](reg, "cart.item_added")
	cartCheckedOut := projector.MustDefine[CartCheckedOut](reg, "cart.checked_out")
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	if _, err := postgres.Migrate(ctx, pool, schema); err != nil { // or `projector migrate`
		panic(err)
	}
	store, err := postgres.New(ctx, pool, postgres.Config{Schema: schema, Registry: reg})
	if err != nil {
		panic(err)
	}
	carts, err := aggregate.New(store, aggregate.Config[Cart]{
		Name: "cart",
		Folds: []aggregate.Fold[Cart]{
			aggregate.On(itemAdded, func(c *Cart, e ItemAdded) {
				c.Items = append(c.Items, e.SKU)
				c.TotalCents += e.Cents
			}),
			aggregate.On(cartCheckedOut, func(c *Cart, _ CartCheckedOut) { c.CheckedOut = true }),
		},
	})
	if err != nil {
		panic(err)
	}

	// Per request: a command loads the cart, decides, appends, commits, and
	// retries by itself if another request got there first.
	cart := projector.Stream("cart", "C-1")
	for _, item := range []ItemAdded{{"socks", 500}, {"shoes", 4500}} {
		if _, err := carts.Handle(ctx, cart, addItem(item.SKU, item.Cents)); err != nil {
			panic(err)
		}
	}
	res, err := carts.Handle(ctx, cart, func(_ context.Context, c aggregate.Loaded[Cart]) ([]any, error) {
		return []any{CartCheckedOut{}}, nil
	})
	if err != nil {
		panic(err)
	}
	fmt.Println("after checkout:", res.Version, res.State.Items, res.State.TotalCents, res.State.CheckedOut)

	_, err = carts.Handle(ctx, cart, addItem("hat", 1500))
	fmt.Println("adding after checkout:", errors.Is(err, errCheckedOut))

	loaded, err := carts.Load(ctx, cart)
	if err != nil {
		panic(err)
	}
	fmt.Println("loaded:", loaded.Version, loaded.State.Items)

	_, err = carts.Load(ctx, projector.Stream("cart", "nope"))
	fmt.Println("missing cart:", errors.Is(err, projector.ErrNotFound))
	// Output:
	// after checkout: 3 [socks shoes] 5000 true
	// adding after checkout: true
	// loaded: 3 [socks shoes]
	// missing cart: true
}

func ExampleRepository_LoadVersion() {
	ctx := context.Background()
	carts, store := newCarts(aggregate.Snapshots{})
	defer store.Pool().Close()
	cart := projector.Stream("cart", "C-2")
	for _, sku := range []string{"socks", "shoes", "hat"} {
		if _, err := carts.Handle(ctx, cart, addItem(sku, 100)); err != nil {
			panic(err)
		}
	}
	then, err := carts.LoadVersion(ctx, cart, 2)
	if err != nil {
		panic(err)
	}
	now, err := carts.Load(ctx, cart)
	if err != nil {
		panic(err)
	}
	fmt.Println("at version 2:", then.State.Items)
	fmt.Println("now:", now.State.Items)
	// Output:
	// at version 2: [socks shoes]
	// now: [socks shoes hat]
}

func ExampleRepository_FetchForWriting() {
	ctx := context.Background()
	carts, store := newCarts(aggregate.Snapshots{})
	defer store.Pool().Close()
	cart := projector.Stream("cart", "C-3")

	// Inside your own transaction, beside your own writes.
	err := pgx.BeginFunc(ctx, store.Pool(), func(tx pgx.Tx) error {
		w, err := carts.FetchForWriting(ctx, tx, cart)
		if err != nil {
			return err
		}
		fmt.Println("exists:", w.Loaded().Exists())
		_, err = w.Append(ctx, ItemAdded{SKU: "socks", Cents: 500})
		return err
	})
	if err != nil {
		panic(err)
	}

	// Two requests fetch the same version; the second to append loses.
	first, _ := store.Pool().Begin(ctx)
	defer first.Rollback(ctx)
	second, _ := store.Pool().Begin(ctx)
	defer second.Rollback(ctx)
	w1, _ := carts.FetchForWriting(ctx, first, cart)
	w2, _ := carts.FetchForWriting(ctx, second, cart)
	if _, err := w1.Append(ctx, ItemAdded{SKU: "shoes", Cents: 4500}); err != nil {
		panic(err)
	}
	if err := first.Commit(ctx); err != nil {
		panic(err)
	}
	_, err = w2.Append(ctx, ItemAdded{SKU: "hat", Cents: 1500})
	fmt.Println("second writer:", errors.Is(err, projector.ErrConcurrency))
	// Output:
	// exists: false
	// second writer: true
}

func ExampleRepository_FetchExclusive() {
	ctx := context.Background()
	carts, store := newCarts(aggregate.Snapshots{})
	defer store.Pool().Close()
	cart := projector.Stream("cart", "C-4")

	holder, _ := store.Pool().Begin(ctx)
	defer holder.Rollback(ctx)
	if _, err := carts.FetchExclusive(ctx, holder, cart); err != nil {
		panic(err)
	}

	// Without NoWait this would wait for holder to finish.
	other, _ := store.Pool().Begin(ctx)
	defer other.Rollback(ctx)
	_, err := carts.FetchExclusive(ctx, other, cart, aggregate.ExclusiveOptions{NoWait: true})
	fmt.Println("locked:", errors.Is(err, aggregate.ErrLocked))
	// Output:
	// locked: true
}

func ExampleSnapshots() {
	ctx := context.Background()
	carts, store := newCarts(aggregate.Snapshots{Every: 2, Version: 1})
	defer store.Pool().Close()
	cart := projector.Stream("cart", "C-5")
	for _, sku := range []string{"a", "b", "c", "d", "e"} {
		if _, err := carts.Handle(ctx, cart, addItem(sku, 100)); err != nil {
			panic(err)
		}
	}
	loaded, err := carts.Load(ctx, cart)
	if err != nil {
		panic(err)
	}
	fmt.Println("version", loaded.Version, "from the snapshot at", loaded.FromSnapshot, loaded.State.Items)
	// Output:
	// version 5 from the snapshot at 4 [a b c d e]
}

func ExampleWriter_AssertVersion() {
	ctx := context.Background()
	carts, store := newCarts(aggregate.Snapshots{})
	defer store.Pool().Close()
	cart := projector.Stream("cart", "C-6")
	if _, err := carts.Handle(ctx, cart, addItem("socks", 500)); err != nil {
		panic(err)
	}

	// A transaction that decides on the cart but writes only elsewhere.
	tx, _ := store.Pool().Begin(ctx)
	defer tx.Rollback(ctx)
	w, _ := carts.FetchForWriting(ctx, tx, cart)

	// Meanwhile another request adds an item.
	if _, err := carts.Handle(ctx, cart, addItem("shoes", 4500)); err != nil {
		panic(err)
	}

	// Just before commit: is the cart still what the decision was based on?
	err := w.AssertVersion(ctx)
	fmt.Println("cart changed:", errors.Is(err, projector.ErrConcurrency))
	// Output:
	// cart changed: true
}
