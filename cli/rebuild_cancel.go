package cli

import (
	"context"
	"fmt"
	"time"

	"github.com/projectorhq/projector/rebuild"
	"github.com/projectorhq/projector/stores/postgres"
)

// cancelNotice is how long `rebuild cancel` waits quietly before it says
// what it is waiting for.
const cancelNotice = time.Second

// cancelWaiting is rebuild.Cancel, saying so when it waits: a cancel takes
// the shadow shard's lock, which a running shadow batch holds until it
// commits or rolls back, and a large batch takes seconds.
func (a *App) cancelWaiting(ctx context.Context, store *postgres.Store, name string) error {
	done := make(chan error, 1)
	go func() { done <- rebuild.Cancel(ctx, store, name) }()
	timer := time.NewTimer(cancelNotice)
	defer timer.Stop()
	select {
	case err := <-done:
		return err
	case <-timer.C:
		fmt.Fprintf(a.out, "rebuild of %s: waiting for the shadow's running batch to commit or roll back (it holds the shadow shard's lock; a batch lasts at most the projection's batch timeout)...\n", name)
		return <-done
	}
}
