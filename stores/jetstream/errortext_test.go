package jetstream_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	pjs "github.com/projectorhq/projector/stores/jetstream"
	"github.com/projectorhq/projector/stores/postgres"
)

// A message that holds personal fields in the clear (published by another
// tool than the relay, which sends them null) and a handler that quotes
// them in its error: the failed retry of its dead letter records, and
// returns, markers instead of the values (projection.StoredError), which
// a forget would not reach.
func TestDeadLetterRetryErrorKeepsNoPersonalValues(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	types := testevents.NewPersonal()
	master, err := postgres.NewMasterKey("k1", testevents.MasterKey("one"))
	if err != nil {
		t.Fatal(err)
	}
	store := pgtest.Store(t, types.Registry, postgres.Config{MasterKey: master})
	var ev projector.Event
	if err := pgx.BeginFunc(ctx, store.Pool(), func(tx pgx.Tx) error {
		res, err := store.Append(ctx, tx, projector.TenantStream("acme", "customer", "c-1"), projector.AnyVersion,
			testevents.CustomerRegistered{Customer: "c-1", Name: "SECRETNAME Ada", Email: "SECRETMAIL@example.com", Plan: "pro"})
		if err == nil {
			ev = res.Events[0]
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	msg, err := pjs.NewMsg("projector", ev) // the payload as the store opened it
	if err != nil {
		t.Fatal(err)
	}
	headers, err := json.Marshal(msg.Header)
	if err != nil {
		t.Fatal(err)
	}
	var id int64
	if err := store.Pool().QueryRow(ctx, `INSERT INTO `+store.Table("projector_jetstream_dead_letters")+
		` (subscription, event_id, subject, headers, data, error, deliveries) VALUES ('feed', $1, $2, $3, $4, 'boom', 5) RETURNING id`,
		ev.ID, msg.Subject, headers, msg.Data).Scan(&id); err != nil {
		t.Fatal(err)
	}
	c, err := pjs.NewConsumer(pjs.ConsumerConfig{Store: store, Subscription: "feed", Handler: func(_ context.Context, _ pgx.Tx, ev projector.Event) error {
		c, _ := ev.Payload.(testevents.CustomerRegistered)
		return fmt.Errorf("cannot take %q <%s>", c.Name, c.Email)
	}})
	if err != nil {
		t.Fatal(err)
	}
	err = c.RetryDeadLetter(ctx, id)
	if err == nil || strings.Contains(err.Error(), "SECRET") || !strings.Contains(err.Error(), `cannot take "[personal:name]" <[personal:email]>`) {
		t.Errorf("failed retry: %v; want the values replaced by markers", err)
	}
	var stored string
	if err := store.Pool().QueryRow(ctx, `SELECT error FROM `+store.Table("projector_jetstream_dead_letters")+` WHERE id = $1`, id).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(stored, "SECRET") || !strings.Contains(stored, `retry: `) || !strings.Contains(stored, `cannot take "[personal:name]" <[personal:email]>`) {
		t.Errorf("stored: %s; want the values replaced by markers", stored)
	}
}
