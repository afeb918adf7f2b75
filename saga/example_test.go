package saga_test

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/saga"
	"github.com/projectorhq/projector/stores/postgres"
)

type OrderPlaced struct {
	Order string `json:"order"`
}

type PaymentReceived struct {
	Order string `json:"order"`
}

type PaymentReminderSent struct {
	Order string `json:"order"`
}

type OrderCancelled struct {
	Order  string `json:"order"`
	Reason string `json:"reason"`
}

// PaymentState is the saga's state per order.
type PaymentState struct {
	Reminded bool `json:"reminded"`
}

// A payment saga: an order placed starts it; unpaid after a day it sends a
// reminder, unpaid after two it cancels the order. A payment completes it.
// The clock is injected so the example can let two days pass.
func ExampleNew() {
	ctx := context.Background()
	// An application reads these from its configuration:
	// os.Getenv("PROJECTOR_DATABASE_URL") and its schema ("projector").
	url, schema := pgtest.ExampleDatabase()

	reg := projector.NewRegistry()
	orderPlaced := projector.MustDefine[OrderPlaced](reg, "order.placed")
	paymentReceived := projector.MustDefine[PaymentReceived](reg, "payment.received")
	projector.MustDefine[PaymentReminderSent](reg, "payment.reminder_sent")
	projector.MustDefine[OrderCancelled](reg, "order.cancelled")

	var mu sync.Mutex
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }

	payment := saga.New[PaymentState]("order_payment", saga.Config{Now: clock})
	byOrder := func(_ projector.Event, e OrderPlaced) string { return e.Order }
	err := saga.StartOn(payment, orderPlaced, byOrder, func(ctx context.Context, in *saga.Instance[PaymentState], ev projector.Event, e OrderPlaced) error {
		in.After("remind", 24*time.Hour)
		return nil
	})
	if err == nil {
		err = saga.On(payment, paymentReceived, func(_ projector.Event, e PaymentReceived) string { return e.Order },
			func(ctx context.Context, in *saga.Instance[PaymentState], ev projector.Event, e PaymentReceived) error {
				in.Complete() // cancels the pending timeouts
				return nil
			})
	}
	if err == nil {
		err = saga.OnTimeout(payment, "remind", func(ctx context.Context, in *saga.Instance[PaymentState], t saga.Timeout) error {
			in.State.Reminded = true
			in.Append(projector.TenantStream(in.Tenant(), "order", in.Key()), projector.AnyVersion, PaymentReminderSent{Order: in.Key()})
			in.After("cancel", 24*time.Hour)
			return nil
		})
	}
	if err == nil {
		err = saga.OnTimeout(payment, "cancel", func(ctx context.Context, in *saga.Instance[PaymentState], t saga.Timeout) error {
			in.Append(projector.TenantStream(in.Tenant(), "order", in.Key()), projector.AnyVersion, OrderCancelled{Order: in.Key(), Reason: "unpaid"})
			in.Complete()
			return nil
		})
	}
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

	// The saga's events go through a dispatcher; its timeouts through a
	// runner started beside it.
	consumer, err := payment.Projection(store)
	if err != nil {
		fmt.Println(err)
		return
	}
	dispatcher, err := projection.New(projection.Config{Store: store, Projections: []*projection.Async{consumer}})
	if err != nil {
		fmt.Println(err)
		return
	}
	runner, err := saga.NewRunner(saga.RunnerConfig{Store: store, Sagas: []saga.Definition{payment}})
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := dispatcher.Start(ctx); err != nil {
		fmt.Println(err)
		return
	}
	defer func() {
		if err := dispatcher.Stop(ctx); err != nil {
			fmt.Println(err)
		}
	}()
	// An application calls runner.Start(ctx) and runner.Stop(ctx); the
	// example fires due timeouts by hand after moving its clock.

	for _, order := range []string{"o-1", "o-2"} {
		err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := store.Append(ctx, tx, projector.Stream("order", order), projector.NoStream, OrderPlaced{Order: order})
			return err
		})
		if err != nil {
			fmt.Println(err)
			return
		}
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := store.Append(ctx, tx, projector.Stream("payment", "p-1"), projector.NoStream, PaymentReceived{Order: "o-1"})
		return err
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := dispatcher.CatchUp(ctx); err != nil {
		fmt.Println(err)
		return
	}
	for range 2 {
		mu.Lock()
		now = now.Add(24 * time.Hour)
		mu.Unlock()
		if _, err := runner.FireDue(ctx); err != nil {
			fmt.Println(err)
			return
		}
	}

	for _, order := range []string{"o-1", "o-2"} {
		in, err := saga.Show(ctx, store, "order_payment", projector.SystemTenant, order)
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("%s: %s after %d steps, state %s\n", order, in.Status, in.Version, in.State)
		for _, a := range in.Appended {
			fmt.Printf("  appended %s to %s\n", a.Type, a.Stream)
		}
	}
	// Output:
	// o-1: completed after 2 steps, state {"reminded": false}
	// o-2: completed after 3 steps, state {"reminded": true}
	//   appended payment.reminder_sent to order/o-2
	//   appended order.cancelled to order/o-2
}
