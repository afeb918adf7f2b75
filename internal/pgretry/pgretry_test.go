package pgretry

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

func TestDo(t *testing.T) {
	t.Parallel()
	conflict := fmt.Errorf("handler: %w", &pgconn.PgError{Code: "40P01", Message: "deadlock detected"})
	other := errors.New("still broken")
	for _, tc := range []struct {
		name      string
		errs      []error // try n returns errs[n], nil past the end
		wantTries int
		wantErr   error
		wantText  string
	}{
		{"succeeds at once", nil, 1, nil, ""},
		{"a conflict, then through", []error{conflict}, 2, nil, ""},
		{"another error is returned at once", []error{other}, 1, other, ""},
		{"a conflict, then another error", []error{conflict, other}, 2, other, ""},
		{"conflicts every time", []error{conflict, conflict, conflict, conflict, conflict, conflict}, Tries, conflict, "aborted by a conflict 5 times, nothing recorded"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tries := 0
			err := Do(context.Background(), "retry x", Conflict, func() error {
				tries++
				if tries <= len(tc.errs) {
					return tc.errs[tries-1]
				}
				return nil
			})
			if tries != tc.wantTries {
				t.Errorf("tried %d times, want %d", tries, tc.wantTries)
			}
			if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil) != (err == nil) {
				t.Errorf("error %v, want %v", err, tc.wantErr)
			}
			if tc.wantText != "" && (err == nil || !strings.Contains(err.Error(), tc.wantText)) {
				t.Errorf("error %v, want it to say %q", err, tc.wantText)
			}
		})
	}
}

// A cancelled context ends the waits between tries: the conflict is
// returned with the context's error, and nothing is tried again.
func TestDoCancelled(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	tries := 0
	err := Do(ctx, "retry x", Conflict, func() error {
		tries++
		cancel()
		return &pgconn.PgError{Code: "40001"}
	})
	if tries != 1 || !errors.Is(err, context.Canceled) || !Conflict(err) {
		t.Fatalf("tries %d, error %v; want one try, the conflict and context.Canceled", tries, err)
	}
}

func TestConflict(t *testing.T) {
	t.Parallel()
	for code, want := range map[string]bool{"40001": true, "40P01": true, "23505": false, "08006": false, "": false} {
		if got := Conflict(&pgconn.PgError{Code: code}); got != want {
			t.Errorf("Conflict(%q) = %v, want %v", code, got, want)
		}
	}
	if Conflict(nil) || Conflict(errors.New("x")) {
		t.Error("Conflict of a non-PostgreSQL error is true")
	}
}

func TestRetryable(t *testing.T) {
	t.Parallel()
	for code, want := range map[string]bool{"40001": true, "40P01": true, "08006": true, "57P01": true, "23505": false, "42P01": false} {
		if got := Retryable(fmt.Errorf("wrapped: %w", &pgconn.PgError{Code: code})); got != want {
			t.Errorf("Retryable(%q) = %v, want %v", code, got, want)
		}
	}
	if !Retryable(&pgconn.ConnectError{}) {
		t.Error("a failure to connect is not retryable")
	}
	if Retryable(nil) || Retryable(errors.New("x")) {
		t.Error("nil or a plain error is retryable")
	}
}
