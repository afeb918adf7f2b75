package projection

import (
	"context"
	"slices"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/stores/postgres"
)

// prefetch is a read of a shard's next batch, taken on a connection of its
// own while the pass that read the current batch applies it, writes its
// cursor and commits: the next pass then finds its rows read (and their
// payloads decoded) instead of waiting a round trip and the server's scan
// for them. The reads of one shard's passes overlap its writes, as the
// server and the client can work at the same time.
//
// Only a full batch is used, for the reason sharedReads shares only full
// batches: it holds limit events after its position, every one from a
// transaction that had ended when it was read (promise 3: the read is
// the gap-safe ReadLogTx), so every event between the position and its
// last had ended too, and the same query returns the same rows at any later
// moment. A partial batch is thrown away and the pass reads again: a late
// commit may have landed in its range since.
//
// The next pass uses the batch only after it holds the shard's lock and has
// read the shard's state (promise 6), and only when the cursor it read is
// the position the prefetch started from: a pass that failed, an operator's
// skip or rewind, or another process's pass moved it, and the batch is
// thrown away. Retention cannot remove its events meanwhile: the shard has
// not passed them.
type prefetch struct {
	q postgres.LogQuery
	// reading is closed once the read holds a connection of its own; until
	// then the next pass does not wait for it (see takePrefetch).
	reading chan struct{}
	cancel  context.CancelFunc
	done    chan struct{} // closed when batch, shared and err are set
	batch   postgres.LogBatch
	shared  bool // the batch came from another shard's read (sharedReads)
	err     error
	// firstRead: a merged parent's first read, begun once the swap
	// committed (startParent, mergehandoff.go), used full or not.
	firstRead bool
}

// startPrefetch reads the batch after next, the cursor the running pass
// will commit after its full batch, in the background. It reads nothing
// when the pool has no connection to spare (none idle, and no room for
// another): a prefetch must not make another shard's pass wait for one.
func (d *Dispatcher) startPrefetch(ctx context.Context, sh *shard, q postgres.LogQuery, next projector.Position) {
	if st := d.store.Pool().Stat(); st.IdleConns() == 0 && st.TotalConns() >= st.MaxConns() {
		return
	}
	q.After = next
	d.launchPrefetch(ctx, sh, q)
}

// launchPrefetch starts the read of q for sh's next pass.
func (d *Dispatcher) launchPrefetch(ctx context.Context, sh *shard, q postgres.LogQuery) {
	d.launchRead(ctx, sh, q, false)
}

// launchRead starts the read of q for sh's next pass; firstRead as in
// prefetch.
func (d *Dispatcher) launchRead(ctx context.Context, sh *shard, q postgres.LogQuery, firstRead bool) {
	ctx, cancel := context.WithCancel(ctx)
	pf := &prefetch{q: q, reading: make(chan struct{}), cancel: cancel, done: make(chan struct{}), firstRead: firstRead}
	sh.prefetch = pf
	decode := !sh.proj.cfg.RawPayloads
	reg := d.store.Registry()
	d.wg.Go(func() {
		defer close(pf.done)
		defer cancel()
		conn, err := d.store.Pool().Acquire(ctx)
		if err != nil {
			pf.err = err
			return
		}
		defer conn.Release()
		close(pf.reading)
		// Through the shared reads when they are on: shards catching up
		// together then prefetch each batch once between them. The read
		// is taken only now that it holds a connection, so a shard that
		// waits for this read waits for one that can finish.
		read := func() (postgres.LogBatch, error) { return d.store.ReadLogTx(ctx, conn, q) }
		if d.shared != nil {
			pf.batch, pf.shared, pf.err = d.shared.read(ctx, q, sh.readKey(), read)
		} else {
			pf.batch, pf.err = read()
		}
		if pf.err != nil || !pf.batch.Full && !pf.firstRead || !decode {
			return
		}
		// The decoding apply would do, done here while the pass's writes
		// are in flight. A payload that fails stays undecoded: apply
		// decodes it again and fails that event, as without a prefetch.
		for i := range pf.batch.Events {
			ev := &pf.batch.Events[i]
			if payload, data, err := reg.Decode(ev.Type, ev.SchemaVersion, ev.Data); err == nil {
				ev.Payload, ev.Data = payload, data
			}
		}
	})
}

// takePrefetch returns the shard's prefetched batch when it is the read q
// asks for and was full, waiting for it if it is still being read, and
// whether another shard's read supplied it. Any prefetch is used once at
// most: the shard's next read starts afresh.
func (d *Dispatcher) takePrefetch(ctx context.Context, sh *shard, q postgres.LogQuery) (batch postgres.LogBatch, ok, shared bool, err error) {
	pf := sh.prefetch
	sh.prefetch = nil
	if pf == nil {
		return postgres.LogBatch{}, false, false, nil
	}
	if pf.q.After != q.After || pf.q.Limit != q.Limit || !slices.Equal(pf.q.EventTypes, q.EventTypes) ||
		!slices.Equal(pf.q.StreamTypes, q.StreamTypes) || pf.q.Raw != q.Raw || pf.q.IncludeArchived != q.IncludeArchived {
		pf.cancel()
		return postgres.LogBatch{}, false, false, nil
	}
	select {
	case <-pf.reading:
	default:
		// Still waiting for a connection, which may be the one this pass
		// holds: every pass of the pool's connections waiting for its
		// prefetch, and every prefetch for a connection, would stall the
		// dispatcher. Read in the pass instead.
		pf.cancel()
		return postgres.LogBatch{}, false, false, nil
	}
	select {
	case <-pf.done:
	case <-ctx.Done():
		return postgres.LogBatch{}, false, false, ctx.Err()
	}
	if pf.err != nil || !pf.batch.Full && !pf.firstRead {
		return postgres.LogBatch{}, false, false, nil
	}
	return pf.batch, true, pf.shared, nil
}
