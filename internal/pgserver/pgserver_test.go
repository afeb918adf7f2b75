package pgserver_test

import (
	"context"
	"errors"
	"os"
	"testing"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/projectorhq/projector/internal/pgserver"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The throwaway cluster starts, answers queries, and leaves nothing behind.
func TestStartStop(t *testing.T) {
	if _, err := pgserver.FindBinaries(); errors.Is(err, pgserver.ErrNoBinaries) && os.Getenv("CI") != "true" {
		t.Skip("no local PostgreSQL binaries")
	}
	ctx := context.Background()
	srv, err := pgserver.Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, srv.URL)
	if err != nil {
		_ = srv.Stop()
		t.Fatal(err)
	}
	var fsync string
	err = conn.QueryRow(ctx, `SHOW fsync`).Scan(&fsync)
	_ = conn.Close(ctx)
	if err != nil || fsync != "off" {
		t.Errorf("SHOW fsync: %q, %v", fsync, err)
	}
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(srv.Dir()); !os.IsNotExist(err) {
		t.Fatalf("cluster directory %s still exists after Stop", srv.Dir())
	}
}
