package projection

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/projectorhq/projector"
)

// A merge command's wait for its halves, and how it ends when its caller
// gives up (docs/scaling.md, "Splitting and merging live").
//
// Every statement of a merge after its hold runs on the connection holding
// its claims (claimPairs), and so does the lifting of its holds
// (unholdFenced): a pool of one connection has no other. pgx closes a
// connection whose statement is cancelled midway, so neither the wait's
// end nor the caller's cancellation may cut a statement short there: both
// stop the command between statements, and the holds are then lifted
// through the connection still open. A statement under way when the caller
// cancels is given mergeGrace to finish (a look is one indexed read of a
// few rows); one held up longer (a lock taken on the consumers table) is
// cut then, and the command leaves its holds as a killed one does, for the
// next run to finish.

// holdPoll is how often a merge looks whether the halves stand at their
// hold. The half that got there first stands still until the next look
// finds its sibling there too, so the look is frequent: one indexed read of
// a few rows, for the few batches a merge waits.
const holdPoll = 5 * time.Millisecond

// mergeGrace is how long a merge's statement on its claims connection may
// run on once the caller cancelled (see above).
const mergeGrace = wakeTimeout

// graceful returns a context for the statements of a merge on its claims
// connection: not cancelled with ctx, but mergeGrace after it; and the
// function that releases it.
func graceful(ctx context.Context) (context.Context, context.CancelFunc) {
	out, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, func() {
		t := time.NewTimer(mergeGrace)
		defer t.Stop()
		select {
		case <-t.C:
			cancel()
		case <-out.Done():
		}
	})
	return out, func() {
		stop()
		cancel()
	}
}

// awaitHolds polls until every pair was merged (its parent there, its
// halves gone: by the pass of the half there second, mergehandoff.go), or
// both halves of each pair not merged have stood at its hold for
// passesGrace. It returns which were merged.
func (a *Admin) awaitHolds(ctx context.Context, conn *pgxpool.Conn, consumer string, pairs []mergePair, wait time.Duration) ([]bool, error) {
	// The wait's end and the caller's cancellation stop the wait between
	// looks, never a look under way (see above): a statement cancelled
	// midway closes its connection, the one holding the claims, through
	// which the holds are then lifted (unholdFenced); a pool of one
	// connection has no other (TestMergeTimingOutDuringALookOnAOneConnectionPool,
	// TestMergeCancelledDuringALookLiftsTheHolds).
	waited, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	look, stopLook := graceful(ctx)
	defer stopLook()
	var ids []string
	holds := map[string]projector.Position{}
	for _, p := range pairs {
		ids = append(ids, segmentInstance(p.parent))
		for _, id := range p.ids() {
			ids = append(ids, id)
			holds[id] = p.hold
		}
	}
	tick := time.NewTicker(holdPoll)
	defer tick.Stop()
	var readySince time.Time // when every half was first seen at its hold, a pair unmerged
	for {
		if err := ctx.Err(); err != nil {
			return nil, mergeCancelled(err)
		}
		rows, err := conn.Query(look, a.split.poll, consumer, ids)
		if err != nil {
			return nil, waitErr(waited, err, "")
		}
		var id string
		var cursor, hold projector.Position
		var held bool
		var status Status
		var attempts int
		var there []string
		at := map[string]bool{}
		behind := ""
		_, err = pgx.ForEachRow(rows, []any{&id, &cursor.TxID, &cursor.Seq, &status, &attempts, &held, &hold.TxID, &hold.Seq}, func() error {
			there = append(there, id)
			if _, half := holds[id]; !half {
				return nil // a parent: merged when its halves are gone
			}
			s, _ := partitionSegment(id)
			if !held || hold != holds[id] {
				return layoutChanged(consumer, "the hold of partition "+s.String()+" was lifted (another merge gave up)")
			}
			if err := mergeable(consumer, s, partRow{status: status, attempts: attempts}); err != nil {
				return err
			}
			if cursor == hold {
				at[id] = true
			} else {
				behind = fmt.Sprintf("partition %s stands at %s, behind %s", s, cursor, hold)
			}
			return nil
		})
		if err != nil {
			return nil, waitErr(waited, err, behind)
		}
		if err := ctx.Err(); err != nil {
			// Cancelled during the look: the command gives up what it
			// saw (the holds are lifted, and the pairs the passes merged
			// named), as between looks.
			return nil, mergeCancelled(err)
		}
		merged := mergedPairs(pairs, there)
		ready := true
		for i, p := range pairs {
			switch {
			case merged[i]:
			case at[segmentInstance(p.lo)] && at[segmentInstance(p.hi)]:
			case !slices.Contains(there, segmentInstance(p.lo)) || !slices.Contains(there, segmentInstance(p.hi)):
				return nil, layoutChanged(consumer, "its partitions were merged or split meanwhile")
			default:
				ready = false
			}
		}
		if a.lookHook != nil {
			a.lookHook(ready, merged)
		}
		switch {
		case ready && !slices.Contains(merged, false):
			return merged, nil
		case ready && readySince.IsZero():
			readySince = time.Now()
		case ready && time.Since(readySince) >= passesGrace:
			return merged, nil
		case !ready:
			readySince = time.Time{}
		}
		select {
		case <-waited.Done():
			if err := ctx.Err(); err != nil {
				return nil, mergeCancelled(err)
			}
			if !readySince.IsZero() {
				// Every half stood at its hold: the wait is over, the
				// grace only waited for the passes' swaps; the command
				// swaps the rest.
				return merged, nil
			}
			return nil, waitErr(waited, waited.Err(), behind)
		case <-tick.C:
		}
	}
}

// passesGrace is how long a merge leaves the swap of a pair whose halves
// both stand at their hold to the pass of the half there second
// (mergehandoff.go) before it swaps the pair itself. The pass's swap is the
// quicker of the two: its dispatcher starts the parent at once, with its
// first read begun, where the command's swap takes the fence and the
// halves' locks (refusing their passes meanwhile), and the parent starts
// at the balancing round its NOTIFY brings: 50–80 ms in a traced merge of
// two dispatchers, against a few milliseconds. Two halves that reached the
// hold at once refuse each other's lock and look again within holdRetry's
// few polls; the grace covers those, so a command that looked just then no
// longer takes the fence from under them. A pair its passes cannot swap (a
// dispatcher of an older release, none running) waits this much longer.
const passesGrace = 5 * holdPoll

// waitErr says what a merge was waiting for when its wait ended.
func waitErr(ctx context.Context, err error, behind string) error {
	if ctx.Err() == nil || behind == "" {
		return err
	}
	return fmt.Errorf("%w: %s (does a dispatcher run the consumer? the holds were lifted; nothing changed)", err, behind)
}

// mergeCancelled is a merge's error when its caller cancelled its wait.
func mergeCancelled(err error) error {
	return fmt.Errorf("cancelled while waiting for the halves to reach their holds: %w", err)
}
