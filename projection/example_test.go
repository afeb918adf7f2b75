package projection_test

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

type OrderPlaced struct {
	Customer string `json:"customer"`
	Cents    int    `json:"cents"`
}

// An inline projection commits with the append: the read model is never
// behind the events.
func ExampleNewInline() {
	ctx := context.Background()
	reg := projector.NewRegistry()
	placed := projector.MustDefine[OrderPlaced](reg, "order.placed")

	var table string // the example's table lives in the store's own schema, known below
	totals := projection.NewInline("order_totals")
	_ = projection.On(totals, placed, func(ctx context.Context, tx pgx.Tx, ev projector.Event, o OrderPlaced) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+table+` AS t (customer, cents) VALUES ($1, $2)
			ON CONFLICT (customer) DO UPDATE SET cents = t.cents + excluded.cents`, o.Customer, o.Cents)
		return err
	})
	// postgres.New(ctx, pool, postgres.Config{Registry: reg, Inline: ...}) in an application:
	store := pgtest.ExampleStore(reg, postgres.Config{Inline: []postgres.InlineProjection{totals}})
	table = store.Schema() + ".order_totals"
	_, _ = store.Pool().Exec(ctx, `CREATE TABLE `+table+` (customer text PRIMARY KEY, cents int NOT NULL)`)

	err := pgx.BeginFunc(ctx, store.Pool(), func(tx pgx.Tx) error {
		_, err := store.Append(ctx, tx, projector.Stream("order", "o-1"), projector.NoStream,
			OrderPlaced{Customer: "ada", Cents: 1200}, OrderPlaced{Customer: "ada", Cents: 300})
		return err
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	var cents int
	_ = store.Pool().QueryRow(ctx, `SELECT cents FROM `+table+` WHERE customer = 'ada'`).Scan(&cents)
	fmt.Println("ada:", cents)
	// Output: ada: 1500
}

// An async projection runs in the dispatcher: after commit, exactly once per
// event inside PostgreSQL, its writes committed with the consumer's cursor.
func ExampleNewAsync() {
	ctx := context.Background()
	reg := projector.NewRegistry()
	placed := projector.MustDefine[OrderPlaced](reg, "order.placed")
	store := pgtest.ExampleStore(reg)
	counts := store.Schema() + ".order_counts"
	_, _ = store.Pool().Exec(ctx, `CREATE TABLE `+counts+` (customer text PRIMARY KEY, orders int NOT NULL)`)

	orders := projection.NewAsync("order_counts", projection.AsyncConfig{})
	_ = projection.On(orders, placed, func(ctx context.Context, tx pgx.Tx, ev projector.Event, o OrderPlaced) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+counts+` AS c (customer, orders) VALUES ($1, 1)
			ON CONFLICT (customer) DO UPDATE SET orders = c.orders + 1`, o.Customer)
		return err
	})
	d, err := projection.New(projection.Config{Store: store, Projections: []*projection.Async{orders}, Logger: quiet})
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := d.Start(ctx); err != nil {
		fmt.Println(err)
		return
	}
	defer func() { _ = d.Stop(ctx) }()

	for _, customer := range []string{"ada", "grace", "ada"} {
		_ = pgx.BeginFunc(ctx, store.Pool(), func(tx pgx.Tx) error {
			_, err := store.Append(ctx, tx, projector.Stream("order", customer), projector.AnyVersion, OrderPlaced{Customer: customer, Cents: 100})
			return err
		})
	}
	wait, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := d.CatchUp(wait); err != nil { // tests and demos wait; applications need not
		fmt.Println(err)
		return
	}
	var ada, grace int
	_ = store.Pool().QueryRow(ctx, `SELECT (SELECT orders FROM `+counts+` WHERE customer = 'ada'), (SELECT orders FROM `+counts+` WHERE customer = 'grace')`).Scan(&ada, &grace)
	fmt.Println("ada:", ada, "grace:", grace)
	// Output: ada: 2 grace: 1
}
