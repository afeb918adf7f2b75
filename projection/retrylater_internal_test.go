package projection

import (
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// A retry request stays for the next look only when its retry lost a
// conflict or its connection: nothing of it committed and the same retry
// may go through. Anything else about the retry (its event pruned, a
// refusal, a constraint) clears it, or it would be tried on every look.
func TestRetryLater(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"deadlock", &pgconn.PgError{Code: "40P01"}, true},
		{"serialization failure, wrapped", fmt.Errorf("retry park 3: %w", &pgconn.PgError{Code: "40001"}), true},
		{"connection exception", &pgconn.PgError{Code: "08006"}, true},
		{"backend terminated", fmt.Errorf("retry: %w", &pgconn.PgError{Code: "57P01"}), true},
		{"unique violation", &pgconn.PgError{Code: "23505"}, false},
		{"undefined table", &pgconn.PgError{Code: "42P01"}, false},
		{"event pruned", fmt.Errorf("retry dead letter 1: %w", ErrEventPruned), false},
		{"plain error", errors.New("boom"), false},
	} {
		if got := retryLater(tc.err); got != tc.want {
			t.Errorf("%s: retryLater(%v) = %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
}
