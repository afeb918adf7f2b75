package projectiontest_test

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/projection/projectiontest"
	"github.com/projectorhq/projector/stores/postgres"
)

type OrderPlaced struct {
	Customer string `json:"customer"`
	Cents    int    `json:"cents"`
}

// orderCounts is the projection under test, as the application builds it.
func orderCounts(reg *projector.Registry, table string) (*projection.Async, error) {
	placed, err := projector.Define[OrderPlaced](reg, "order.placed")
	if err != nil {
		return nil, err
	}
	p := projection.NewAsync("order_counts", projection.AsyncConfig{})
	err = projection.On(p, placed, func(ctx context.Context, _ pgx.Tx, _ projector.Event, o OrderPlaced) error {
		return projection.Queue(ctx, `INSERT INTO `+table+` AS c (customer, orders, cents) VALUES ($1, 1, $2)
			ON CONFLICT (customer) DO UPDATE SET orders = c.orders + 1, cents = c.cents + excluded.cents`, o.Customer, o.Cents)
	})
	return p, err
}

// A spec file of an application: the store and tables are set up once,
// then every spec runs in a transaction of its own that is rolled back, in
// parallel with the others. (Compiled, not run: specs need a test's
// *testing.T; the body of testOrderCounts is a TestOrderCounts.)
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("PROJECTOR_TEST_DATABASE_URL"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()
	if _, err := postgres.Migrate(ctx, pool, "projector"); err != nil {
		fmt.Println(err)
		return
	}
	reg := projector.NewRegistry()
	table := pgx.Identifier{"public", "order_counts"}.Sanitize()
	orders, err := orderCounts(reg, table)
	if err != nil {
		fmt.Println(err)
		return
	}
	store, err := postgres.New(ctx, pool, postgres.Config{Schema: "projector", Registry: reg})
	if err != nil {
		fmt.Println(err)
		return
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+table+` (customer text PRIMARY KEY, orders int NOT NULL, cents int NOT NULL)`); err != nil {
		fmt.Println(err)
		return
	}

	testOrderCounts := func(t *testing.T) {
		t.Parallel()
		projectiontest.New(t, projectiontest.Config{Store: store, Async: orders}).
			Given(projector.Stream("order", "o-1"), OrderPlaced{Customer: "ada", Cents: 250}).
			Given(projector.Stream("order", "o-2"), OrderPlaced{Customer: "ada", Cents: 100}).
			ThenRows(`SELECT customer, orders, cents FROM `+table,
				projectiontest.Row{"ada", 2, 350})
	}
	_ = testOrderCounts
}
