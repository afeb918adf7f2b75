package jetstream

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

// MaxTailWalk bounds how many messages the relay reads back from the
// stream's end when it looks for events already stored past its cursor
// (see [Relay] on downtime longer than the duplicate window). Messages of
// other publishers in the stream, and of the relay's other partitions,
// count against it; past it the relay logs a
// warning and relies on the duplicate window alone for that batch.
const MaxTailWalk = 10_000

// tail is what the relay knows of the events JetStream stored past its
// committed cursor: a crash (or a failed cursor commit) between the
// acknowledgements and the commit leaves such events, and the dispatcher
// hands them to the relay again. Publishing them again is harmless inside
// the duplicate window; after it (a relay down longer than the window) the
// stream would store them twice. The relay skips the events it knows are
// stored, so the window is a second line, not the only one.
//
// The knowledge is exact under the relay's single owner (the dispatcher's
// shard lock; a partitioned relay keeps one tail per partition and counts
// only its own streams' messages, relay_shard.go): every message of an event at or before the cursor was
// stored before the cursor committed, every message past it after, so the
// messages past the cursor are a suffix of the stream. The relay reads that
// suffix back (a walk) when it has no knowledge of its own: on its first
// batch, after any failed publish (some of the batch may be stored), and
// when its last batch is older than half the duplicate window (another
// dispatcher may have run the relay meanwhile). Between walks it adds what
// it published and drops what sorts before the batch it is handed, and
// reads nothing.
type tail struct {
	mu       sync.Mutex
	known    bool // stored is complete past the cursor
	lastUsed time.Time
	stored   map[uuid.UUID]projector.Position
}

// skipSet returns the ids of events the stream already holds past the
// committed cursor, among which those of batch, walking the stream's end
// when needed. Outside a dispatcher (no store in ctx) it returns nil:
// nothing skipped.
//
// Between walks it reads nothing: it drops what sorts before the batch's
// first event. At a pass's first call that is at or before the cursor,
// never handed over again. At a later call of the same pass (another
// tenant's events) it may drop events of the pass; were the pass then
// retried, they would be published again within half a window of this
// call (else the next call walks), which the duplicate window absorbs.
func (r *Relay) skipSet(ctx context.Context, rs *relayShard, b projection.Batch) (map[uuid.UUID]projector.Position, error) {
	store, ok := projection.StoreFrom(ctx)
	if !ok || r.noTailCheck || b.Len() == 0 {
		return nil, nil
	}
	first := b.Streams[0].Events[0].Position
	for _, s := range b.Streams {
		if s.Events[0].Position.Less(first) {
			first = s.Events[0].Position
		}
	}
	t := &rs.tail
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stored == nil {
		t.stored = map[uuid.UUID]projector.Position{}
	}
	stale := time.Since(t.lastUsed) > r.cfg.DuplicateWindow/2
	t.lastUsed = time.Now()
	if !t.known || stale {
		cursor, err := r.committedCursor(ctx, store, rs.instance)
		if err != nil {
			return nil, err
		}
		clear(t.stored)
		n, err := r.walk(ctx, rs, cursor, t.stored)
		if err != nil {
			return nil, err
		}
		t.known = true
		if n > 0 {
			r.metrics.walked.Add(float64(n))
		}
	}
	for id, p := range t.stored {
		if p.Less(first) {
			delete(t.stored, id)
		}
	}
	return t.stored, nil
}

// published records events JetStream acknowledged; lost says a publish
// failed, so the stream may hold events the relay does not know of.
func (rs *relayShard) published(ids map[uuid.UUID]projector.Position, lost bool) {
	t := &rs.tail
	t.mu.Lock()
	defer t.mu.Unlock()
	if lost {
		t.known = false
		return
	}
	if t.stored == nil {
		t.stored = map[uuid.UUID]projector.Position{}
	}
	for id, p := range ids {
		t.stored[id] = p
	}
}

// committedCursor reads the committed cursor of the relay consumer's shard
// instance (not the pass's own transaction: what a crash would leave): its
// one shard, [projection.SharedInstance], or one of its partitions.
func (r *Relay) committedCursor(ctx context.Context, store *postgres.Store, instance string) (projector.Position, error) {
	var p projector.Position
	err := store.Pool().QueryRow(ctx, `SELECT cursor_tx_id::text::bigint, cursor_seq FROM `+store.Table("projector_consumers")+
		` WHERE name = $1 AND instance_id = $2`, r.cfg.Name, instance).Scan(&p.TxID, &p.Seq)
	if errors.Is(err, pgx.ErrNoRows) {
		// The consumer's first pass, its row not committed yet: nothing
		// of it is past a cursor it does not have, so every relayed
		// message in the stream is a candidate.
		return projector.Start, nil
	}
	if err != nil {
		return p, fmt.Errorf("jetstream relay: read the committed cursor of %s: %w", r.cfg.Name, err)
	}
	return p, nil
}

// walk reads the stream back from its last message and records in stored
// every event of rs's streams whose position is past cursor, stopping at
// the first of rs's messages at or before it. It returns how many messages
// it read, other partitions' included.
//
// A partition publishes its own streams one pass at a time, in its log
// order, so its messages past its cursor are a suffix of its messages in
// the stream, interleaved with the other partitions' (which may be ahead of
// or behind it: their positions say nothing of its cursor).
func (r *Relay) walk(ctx context.Context, rs *relayShard, cursor projector.Position, stored map[uuid.UUID]projector.Position) (int, error) {
	// Each request is bounded like a publish: NATS down must fail the
	// batch (and show in the consumer's state) as quickly as a publish
	// would, not wait out the batch timeout.
	rctx, cancel := context.WithTimeout(ctx, r.cfg.PublishTimeout)
	s, err := r.js.Stream(rctx, r.cfg.Stream)
	cancel()
	if err != nil {
		return 0, fmt.Errorf("jetstream relay: stream %s: %w", r.cfg.Stream, err)
	}
	st := s.CachedInfo().State
	if st.Msgs == 0 {
		return 0, nil
	}
	read := 0
	for seq := st.LastSeq; seq >= st.FirstSeq && seq > 0; seq-- {
		if read >= MaxTailWalk {
			r.logger.Warn("jetstream relay: stopped reading the stream back; relying on the duplicate window for this batch",
				"relay", r.cfg.Name, "stream", r.cfg.Stream, "messages_read", read)
			return read, nil
		}
		rctx, cancel := context.WithTimeout(ctx, r.cfg.PublishTimeout)
		m, err := s.GetMsg(rctx, seq)
		cancel()
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return read, fmt.Errorf("jetstream relay: read back message %d of %s: %w", seq, r.cfg.Stream, err)
		}
		read++
		pos, perr := projector.ParsePosition(m.Header.Get(HeaderPosition))
		id, ierr := uuid.Parse(m.Header.Get(HeaderEventID))
		if perr != nil || ierr != nil {
			continue // another publisher's message
		}
		if !rs.holds(m) {
			continue // another partition's
		}
		if !cursor.Less(pos) {
			return read, nil
		}
		stored[id] = pos
	}
	return read, nil
}
