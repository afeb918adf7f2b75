package projection_test

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

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
	// An application reads these from its configuration:
	// os.Getenv("PROJECTOR_DATABASE_URL") and its schema ("projector").
	url, schema := pgtest.ExampleDatabase()

	reg := projector.NewRegistry()
	orderPlaced, err := projector.Define[OrderPlaced](reg, "order.placed")
	if err != nil {
		fmt.Println(err)
		return
	}
	// The example keeps its read model in Projector's schema; an
	// application's tables live wherever it likes.
	table := pgx.Identifier{schema, "order_totals"}.Sanitize()
	totals := projection.NewInline("order_totals")
	if err := projection.On(totals, orderPlaced, func(ctx context.Context, tx pgx.Tx, ev projector.Event, o OrderPlaced) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+table+` AS t (customer, cents) VALUES ($1, $2)
			ON CONFLICT (customer) DO UPDATE SET cents = t.cents + excluded.cents`, o.Customer, o.Cents)
		return err
	}); err != nil {
		fmt.Println(err)
		return
	}

	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()
	if _, err := postgres.Migrate(ctx, pool, schema); err != nil {
		fmt.Println(err)
		return
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE `+table+` (customer text PRIMARY KEY, cents int NOT NULL)`); err != nil {
		fmt.Println(err)
		return
	}
	store, err := postgres.New(ctx, pool, postgres.Config{
		Schema:   schema,
		Registry: reg,
		Inline:   []postgres.InlineProjection{totals},
	})
	if err != nil {
		fmt.Println(err)
		return
	}

	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := store.Append(ctx, tx, projector.Stream("order", "o-1"), projector.NoStream,
			OrderPlaced{Customer: "ada", Cents: 1200}, OrderPlaced{Customer: "ada", Cents: 300})
		return err
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	var cents int
	if err := pool.QueryRow(ctx, `SELECT cents FROM `+table+` WHERE customer = 'ada'`).Scan(&cents); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("ada:", cents)
	// Output: ada: 1500
}

// An async projection runs in the dispatcher: after commit, exactly once per
// event inside PostgreSQL, its writes committed with the consumer's cursor.
// Dispatcher.CatchUp is how a test (or a demo) waits for the read model.
func ExampleNewAsync() {
	ctx := context.Background()
	url, schema := pgtest.ExampleDatabase() // an application: its own URL and schema

	reg := projector.NewRegistry()
	orderPlaced, err := projector.Define[OrderPlaced](reg, "order.placed")
	if err != nil {
		fmt.Println(err)
		return
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()
	if _, err := postgres.Migrate(ctx, pool, schema); err != nil {
		fmt.Println(err)
		return
	}
	store, err := postgres.New(ctx, pool, postgres.Config{Schema: schema, Registry: reg})
	if err != nil {
		fmt.Println(err)
		return
	}
	counts := pgx.Identifier{schema, "order_counts"}.Sanitize()
	if _, err := pool.Exec(ctx, `CREATE TABLE `+counts+` (customer text PRIMARY KEY, orders int NOT NULL)`); err != nil {
		fmt.Println(err)
		return
	}

	orders := projection.NewAsync("order_counts", projection.AsyncConfig{})
	if err := projection.On(orders, orderPlaced, func(ctx context.Context, tx pgx.Tx, ev projector.Event, o OrderPlaced) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+counts+` AS c (customer, orders) VALUES ($1, 1)
			ON CONFLICT (customer) DO UPDATE SET orders = c.orders + 1`, o.Customer)
		return err
	}); err != nil {
		fmt.Println(err)
		return
	}
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
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := store.Append(ctx, tx, projector.Stream("order", customer), projector.AnyVersion, OrderPlaced{Customer: customer, Cents: 100})
			return err
		})
		if err != nil {
			fmt.Println(err)
			return
		}
	}
	wait, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := d.CatchUp(wait); err != nil { // tests and demos wait; applications need not
		fmt.Println(err)
		return
	}
	var ada, grace int
	if err := pool.QueryRow(ctx, `SELECT (SELECT orders FROM `+counts+` WHERE customer = 'ada'), (SELECT orders FROM `+counts+` WHERE customer = 'grace')`).Scan(&ada, &grace); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("ada:", ada, "grace:", grace)
	// Output: ada: 2 grace: 1
}
