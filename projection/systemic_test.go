package projection_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
)

func TestIsConnectionLoss(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{&pgconn.PgError{Code: "57P01"}, true},
		{fmt.Errorf("apply: %w", &pgconn.PgError{Code: "08006"}), true},
		{&pgconn.PgError{Code: "42P01"}, false},
		{errors.New("boom"), false},
	} {
		if got := projection.IsConnectionLoss(tc.err); got != tc.want {
			t.Errorf("IsConnectionLoss(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

func TestIsSystemic(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{errors.New("boom"), false},
		{&pgconn.PgError{Code: "42P01"}, true},
		{fmt.Errorf("write: %w", &pgconn.PgError{Code: "42703"}), true},
		{&pgconn.PgError{Code: "42501", Routine: "aclcheck_error"}, true},
		{&pgconn.PgError{Code: "42501", Routine: "ExecWithCheckOptions"}, false}, // a row-level-security refusal of one row
		{&pgconn.PgError{Code: "08006"}, true},
		{&pgconn.PgError{Code: "57P01"}, true},
		{&pgconn.PgError{Code: "53100"}, true},
		{&pgconn.PgError{Code: "23505"}, false}, // unique violation: about the event
		{&pgconn.PgError{Code: "22P02"}, false}, // invalid text representation
		{&pgconn.PgError{Code: "40001"}, false}, // serialization failure: retry
		{&pgconn.PgError{Code: "57014"}, false}, // statement timeout
		{&pgconn.PgError{Code: "P0001"}, false}, // a RAISE in the user's function
		{fmt.Errorf("%w: backend down", projection.ErrSystemic), true},
	} {
		if got := projection.IsSystemic(tc.err); got != tc.want {
			t.Errorf("IsSystemic(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// A handler writing to a table that does not exist fails for every event:
// in either error mode the shard stops at the first one, dead with an error
// that says so, and nothing is dead-lettered.
func TestSystemicFailureStopsShardInAnyMode(t *testing.T) {
	t.Parallel()
	for _, mode := range []projection.ErrorMode{projection.SkipApplyErrors, projection.HaltOnError} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			name := "missing_" + strings.ReplaceAll(mode.String(), "-", "_")
			p := projection.NewAsync(name, projection.AsyncConfig{ErrorMode: mode, MaxAttempts: 10})
			missing := e.table("no_such_table")
			must(projection.On(p, e.types.Opened, func(ctx context.Context, tx pgx.Tx, ev projector.Event, o testevents.TicketOpened) error {
				_, err := tx.Exec(ctx, `INSERT INTO `+missing+` (id) VALUES ($1)`, ev.ID)
				return err
			}))
			for i := range 20 {
				e.appendOne(fmt.Sprintf("s%d", i), projector.NoStream, testevents.TicketOpened{Title: "t"})
			}
			e.dispatcher(projection.Config{Projections: []*projection.Async{p}})
			admin := projection.NewAdmin(e.store)
			deadLetters := func() int {
				var n int
				if err := e.store.Pool().QueryRow(e.ctx, `SELECT count(*) FROM `+e.store.Table("projector_dead_letters")).Scan(&n); err != nil {
					t.Fatal(err)
				}
				return n
			}
			var st projection.ShardState
			eventually(t, 30*time.Second, "the shard to stop, retry or dead-letter", func() bool {
				st = e.status(admin, name)
				return st.Status == projection.StatusDead || st.Attempts > 1 || deadLetters() > 0
			})
			if n := deadLetters(); n != 0 {
				t.Fatalf("%d events dead-lettered by a systemic failure, want none", n)
			}
			if st.Status != projection.StatusDead || st.Attempts != 1 {
				t.Fatalf("shard after a systemic failure: status %s, attempts %d; want dead at the first attempt", st.Status, st.Attempts)
			}
			if !strings.Contains(st.LastError, "systemic") || !strings.Contains(st.LastError, "42P01") {
				t.Errorf("last error %q does not say the failure is systemic (42P01)", st.LastError)
			}
		})
	}
}
