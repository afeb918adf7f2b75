package postgres_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/stores/postgres"
)

func TestMain(m *testing.M) {
	if os.Getenv(importChildEnv) != "" {
		os.Exit(importChild()) // the helper process of TestHistory_ImportCrashResumes
	}
	if os.Getenv(rewrapChildEnv) != "" {
		os.Exit(rewrapChild()) // the helper process of TestRewrapCrashResumes
	}
	pgtest.Main(m)
}

// readLogN reads the log from the start until it returns want events. The
// log reads only below the horizon, which other tests' open transactions
// elsewhere in the cluster hold back for a moment, so a single read may
// come back short; a read that is still short after 30 s fails the test.
func readLogN(t *testing.T, ctx context.Context, store *postgres.Store, q postgres.LogQuery, want int) []projector.Event {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		b, err := store.ReadLog(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		if len(b.Events) >= want {
			return b.Events
		}
		if time.Now().After(deadline) {
			t.Fatalf("the log still reads %d of %d events", len(b.Events), want)
		}
		time.Sleep(5 * time.Millisecond) // polling interval, not synchronisation
	}
}
