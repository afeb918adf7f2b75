package saga_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/aggregate"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/saga"
	"github.com/projectorhq/projector/stores/postgres"
)

// A saga step or timeout that quotes personal fields of its state in its
// error (values the event it handles does not hold) had them stored whole
// in the dead letter, the park, the shard's last_error and the instance's
// last_error, where a forget does not reach them (promise 19). They hold
// markers now, and after the forget no text or JSON column of the schema
// holds anything of them.
func TestSagaStepErrorsKeepNoPersonalValues(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		mode projection.ErrorMode
		// where returns the stored text of the step's failure, "" while
		// there is none.
		where func(e *env) string
	}{
		{"continuous", projection.SkipApplyErrors, func(e *env) string {
			dls, err := projection.ListDeadLetters(e.ctx, e.store, projection.DeadLetterFilter{Consumer: "welcome"})
			if err != nil || len(dls) == 0 {
				return ""
			}
			return dls[0].Error + "\n" + instanceError(e)
		}},
		{"parking", projection.ParkStream, func(e *env) string {
			parks, err := projection.ListParks(e.ctx, e.store, projection.ParkFilter{Consumer: "welcome"})
			if err != nil || len(parks) == 0 {
				return ""
			}
			return parks[0].Error
		}},
		{"halting", projection.HaltOnError, func(e *env) string {
			st, err := projection.NewAdmin(e.store).Status(e.ctx, projection.ShardID{Consumer: "welcome", Instance: projection.SharedInstance})
			if err != nil {
				return ""
			}
			return st.LastError
		}},
		{"timeout", projection.HaltOnError, instanceError},
		// The step decides, and a command it runs fails quoting the
		// decided state (applied after the handler: its own path).
		{"command", projection.SkipApplyErrors, func(e *env) string {
			dls, err := projection.ListDeadLetters(e.ctx, e.store, projection.DeadLetterFilter{Consumer: "welcome"})
			if err != nil || len(dls) == 0 {
				return ""
			}
			return dls[0].Error + "\n" + instanceError(e)
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ty := testevents.NewPersonal()
			master, err := postgres.NewMasterKey("k1", testevents.MasterKey("one"))
			if err != nil {
				t.Fatal(err)
			}
			store := pgtest.Store(t, ty.Registry, postgres.Config{MasterKey: master})
			e := &env{t: t, ctx: context.Background(), store: store}
			s := saga.New[welcomeState]("welcome", saga.Config{Personal: welcomePersonal, TimeoutAttempts: 1,
				Async: projection.AsyncConfig{ErrorMode: c.mode, MaxAttempts: 1, RetryBackoff: 20 * time.Millisecond}})
			fail := func(in *saga.Instance[welcomeState]) error {
				if in.State.Name == "" {
					return nil // forgotten
				}
				return fmt.Errorf("cannot welcome %q <%s>", in.State.Name, in.State.Email)
			}
			must(saga.StartOn(s, ty.Registered, func(_ projector.Event, e testevents.CustomerRegistered) string { return e.Customer },
				func(_ context.Context, in *saga.Instance[welcomeState], _ projector.Event, e testevents.CustomerRegistered) error {
					in.State = welcomeState{Customer: e.Customer, Name: e.Name, Email: e.Email, Plan: e.Plan}
					in.After("nudge", time.Millisecond)
					return nil
				}))
			type account struct{}
			repo, err := aggregate.New(store, aggregate.Config[account]{Name: "account", Folds: []aggregate.Fold[account]{
				aggregate.On(ty.Plain, func(*account, testevents.CustomerPlain) {}),
			}})
			if err != nil {
				t.Fatal(err)
			}
			must(saga.On(s, ty.Plain, func(_ projector.Event, e testevents.CustomerPlain) string { return e.Customer },
				func(_ context.Context, in *saga.Instance[welcomeState], _ projector.Event, _ testevents.CustomerPlain) error {
					if c.name != "command" {
						return fail(in)
					}
					saga.Command(in, repo, projector.TenantStream("acme", "account", in.Key()), func(context.Context, aggregate.Loaded[account]) ([]any, error) {
						return nil, fail(in)
					})
					return nil
				}))
			must(saga.OnTimeout(s, "nudge", func(_ context.Context, in *saga.Instance[welcomeState], _ saga.Timeout) error {
				return fail(in)
			}))
			e.dispatcher(s, projection.Config{})
			stream := projector.TenantStream("acme", "customer", "c-1")
			e.append(stream, testevents.CustomerRegistered{Customer: "c-1", Name: "SECRETNAME Ada", Email: "SECRETMAIL@example.com", Plan: "pro"})
			e.waitFor("the instance", 30*time.Second, func() bool { return e.instances() == 1 })
			if c.name == "timeout" {
				r := e.runner(s)
				e.waitFor("the timeout to fail", 30*time.Second, func() bool {
					// The round reports the step's failure, redacted too.
					if _, err := r.FireDue(e.ctx); err != nil && strings.Contains(err.Error(), "SECRET") {
						t.Errorf("FireDue: %v", err)
					}
					return instanceError(e) != ""
				})
			} else {
				e.append(stream, testevents.CustomerPlain{Customer: "c-1"})
			}
			var text string
			e.waitFor("the step's failure", 30*time.Second, func() bool {
				text = c.where(e)
				return text != "" && !strings.HasSuffix(text, "\n")
			})
			if strings.Contains(text, "SECRET") || !strings.Contains(text, `cannot welcome "[personal:name]" <[personal:email]>`) {
				t.Errorf("stored: %s; want the values replaced by markers", text)
			}
			if _, err := store.Forget(e.ctx, postgres.SubjectRef{Tenant: "acme", ID: "c-1"}); err != nil {
				t.Fatal(err)
			}
			noSecretInSchema(e)
		})
	}
}

// instanceError is the last_error of the one saga instance.
func instanceError(e *env) string {
	var s string
	_ = e.store.Pool().QueryRow(e.ctx, `SELECT coalesce(last_error, '') FROM `+e.store.Table("projector_saga_instances")).Scan(&s)
	return s
}

// noSecretInSchema fails the test if a text, JSON or character column of
// a table of the store's schema holds "SECRET", as pg_dump would write it.
func noSecretInSchema(e *env) {
	e.t.Helper()
	rows, err := e.store.Pool().Query(e.ctx, `SELECT table_name, column_name FROM information_schema.columns
		WHERE table_schema = $1 AND data_type IN ('text', 'jsonb', 'json', 'character varying', 'character', 'ARRAY')`, e.store.Schema())
	if err != nil {
		e.t.Fatal(err)
	}
	columns, err := pgx.CollectRows(rows, pgx.RowToStructByPos[struct{ Table, Column string }])
	if err != nil || len(columns) == 0 {
		e.t.Fatalf("columns: %v, %v", columns, err)
	}
	for _, col := range columns {
		n := e.count(`SELECT count(*) FROM ` + e.store.Table(col.Table) + ` WHERE ` + pgx.Identifier{col.Column}.Sanitize() + `::text LIKE '%SECRET%'`)
		if n > 0 {
			e.t.Errorf("%s.%s: %d rows hold a personal value of the forgotten subject", col.Table, col.Column, n)
		}
	}
}
