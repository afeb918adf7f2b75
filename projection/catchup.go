package projection

// Waiting for a dispatcher to catch up, and the broadcast its passes use to
// wake waiters.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
)

// CatchUp waits until every shard this dispatcher runs (that is not dead
// or disabled) has passed every event committed before CatchUp was called,
// polling the state table. It returns an error naming dead shards, if any,
// once the others are caught up. Database errors are retried until ctx ends,
// as the dispatcher itself retries them. The dispatcher must be running: on
// one never started CatchUp returns [ErrNotStarted] at once rather than wait
// for shards nothing moves.
func (d *Dispatcher) CatchUp(ctx context.Context) error {
	d.mu.Lock()
	started := d.started
	d.mu.Unlock()
	if !started {
		return fmt.Errorf("catch up: %w; call Start first", ErrNotStarted)
	}
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	var target *projector.Position
	var lastErr error
	for {
		behind, dead := -1, []string{}
		if target == nil {
			if pos, _, err := d.head(ctx); err != nil {
				lastErr = err
			} else {
				target = &pos
			}
		}
		if target != nil {
			behind, dead, lastErr = d.behind(ctx, *target)
		}
		if behind == 0 && lastErr == nil {
			if len(dead) > 0 {
				return fmt.Errorf("catch up: consumers %v are dead", dead)
			}
			return nil
		}
		select {
		case <-ctx.Done():
			if lastErr != nil {
				return fmt.Errorf("catch up: %w (last error: %w)", ctx.Err(), lastErr)
			}
			return fmt.Errorf("catch up: %d shards still behind: %w", behind, ctx.Err())
		case <-d.stopped:
			return errors.New("catch up: dispatcher stopped")
		case <-tick.C:
		}
	}
}

// behind counts this dispatcher's live shards whose cursor is before
// target, and names the dead ones.
func (d *Dispatcher) behind(ctx context.Context, target projector.Position) (int, []string, error) {
	// Cursors and statuses only, every shard in one query: the lag count
	// Admin.List adds would read the whole backlog on every poll.
	shards := d.allShards()
	names := make([]string, len(shards))
	instances := make([]string, len(shards))
	for i, sh := range shards {
		names[i], instances[i] = sh.id.Consumer, sh.id.Instance
	}
	rows, err := d.store.Pool().Query(ctx, d.sql.cursors, names, instances)
	if err != nil {
		return -1, nil, fmt.Errorf("read shards: %w", err)
	}
	var id ShardID
	var cursor projector.Position
	var status Status
	behind, dead, seen, seenParts := 0, []string{}, 0, 0
	_, err = pgx.ForEachRow(rows, []any{&id.Consumer, &id.Instance, &cursor.TxID, &cursor.Seq, &status}, func() error {
		seen++
		if _, ok := partitionSegment(id.Instance); ok {
			seenParts++
		}
		switch {
		case status == StatusDead:
			dead = append(dead, id.String())
		case status == StatusDisabled:
		case cursor.Less(target):
			behind++
		}
		return nil
	})
	if err != nil {
		return -1, nil, fmt.Errorf("read shards: %w", err)
	}
	parts := 0
	for _, sh := range shards {
		if sh.balancer != nil {
			parts++
		}
	}
	if seen-seenParts != len(shards)-parts {
		return -1, nil, fmt.Errorf("read shards: %d of %d state rows exist", seen, len(shards))
	}
	// A partition split or merged away since the list was taken counts as
	// behind: the next poll reads the new layout.
	behind += parts - seenParts
	return behind, dead, nil
}

// broadcast wakes every waiter at once: waiters take the current channel,
// broadcast closes it and installs a new one.
type broadcast struct {
	mu sync.Mutex
	ch chan struct{}
}

func (b *broadcast) wait() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ch == nil {
		b.ch = make(chan struct{})
	}
	return b.ch
}

func (b *broadcast) broadcast() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ch != nil {
		close(b.ch)
	}
	b.ch = make(chan struct{})
}
