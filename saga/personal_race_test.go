package saga_test

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/saga"
	"github.com/projectorhq/projector/stores/postgres"
)

// TestSagaStepRacingForget: a forget of the subject commits while a saga
// step for it is running — after the step read the event (its personal
// fields opened in the clear) and before the step commits. Whether the step
// starts the instance or continues it, nothing errors, the stored state
// holds none of the subject's personal data, and the next step loads the
// fields as zero values.
func TestSagaStepRacingForget(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		// gapOn is the event type whose step the forget interrupts.
		gapOn string
	}{
		{"starting step", "customer.registered"},
		{"later step", "customer.plain_registered"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			ty := testevents.NewPersonal()
			master, err := postgres.NewMasterKey("k1", testevents.MasterKey("one"))
			if err != nil {
				t.Fatal(err)
			}
			store := pgtest.Store(t, ty.Registry, postgres.Config{MasterKey: master})
			e := &env{t: t, ctx: ctx, store: store}
			subject := postgres.SubjectRef{Tenant: "acme", ID: "c-1"}
			var mu sync.Mutex
			var seen []string
			forgot := false
			// gap runs inside the step's transaction, after the step has
			// the event: the forget commits in its own transaction.
			gap := func(ctx context.Context, typ string) error {
				mu.Lock()
				defer mu.Unlock()
				if typ != c.gapOn || forgot {
					return nil
				}
				forgot = true
				_, err := store.Forget(ctx, subject)
				return err
			}
			s := saga.New[welcomeState]("welcome", saga.Config{Personal: welcomePersonal})
			must(saga.StartOn(s, ty.Registered, func(_ projector.Event, e testevents.CustomerRegistered) string { return e.Customer },
				func(ctx context.Context, in *saga.Instance[welcomeState], ev projector.Event, e testevents.CustomerRegistered) error {
					in.State = welcomeState{Customer: e.Customer, Name: e.Name, Email: e.Email, Plan: e.Plan, Steps: in.State.Steps + 1}
					return gap(ctx, ev.Type)
				}))
			must(saga.On(s, ty.Plain, func(_ projector.Event, e testevents.CustomerPlain) string { return e.Customer },
				func(ctx context.Context, in *saga.Instance[welcomeState], ev projector.Event, _ testevents.CustomerPlain) error {
					mu.Lock()
					seen = append(seen, in.State.Name)
					mu.Unlock()
					in.State.Steps++
					return gap(ctx, ev.Type)
				}))
			d := e.dispatcher(s, projection.Config{})
			stream := projector.TenantStream("acme", "customer", "c-1")
			e.append(stream, testevents.CustomerRegistered{Customer: "c-1", Name: "Ada Lovelace", Email: "ada@example.com", Plan: "pro"})
			e.catchUp(d)
			e.append(stream, testevents.CustomerPlain{Customer: "c-1"})
			e.catchUp(d)
			if !forgot {
				t.Fatal("the forget never ran")
			}
			var state, status string
			err = store.Pool().QueryRow(ctx, `SELECT state::text, status FROM `+store.Table("projector_saga_instances")+` WHERE saga = 'welcome'`).Scan(&state, &status)
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(state, "Ada") || strings.Contains(state, "ada@") || !strings.Contains(state, `"plan": "pro"`) || status != "active" {
				t.Fatalf("saga state %s (%s) after the forget: want no personal data, the rest kept, active", state, status)
			}
			e.append(stream, testevents.CustomerPlain{Customer: "c-1"})
			e.catchUp(d)
			mu.Lock()
			defer mu.Unlock()
			want := []string{"", ""}
			if c.gapOn == "customer.plain_registered" {
				want = []string{"Ada Lovelace", ""} // the step the forget interrupted had loaded it before
			}
			if !slices.Equal(seen, want) {
				t.Fatalf("the later steps saw names %q, want %q", seen, want)
			}
			if e.count(`SELECT count(*) FROM `+store.Table("projector_consumers")+` WHERE status IN ('dead', 'disabled')`) != 0 {
				t.Fatal("a consumer is dead or disabled")
			}
		})
	}
}
