package projection

// The apply of one batch inside a pass's transaction: decoding, tenant
// scoping, savepoints around a failing event, and the transaction handed
// to handlers. pass.go owns the transaction and the cursor around it.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel/trace"

	"github.com/projectorhq/projector"
)

// run is the state of one pass's handler calls.
type run struct {
	d  *Dispatcher
	tx pgx.Tx
	sh *shard
	// handlerCtx carries the batch deadline; handlers run under it, the
	// pass's own statements do not.
	handlerCtx context.Context
	// current is the event a handler is working on (the first of a batch
	// handler's events), for a failure that ends the transaction.
	current *projector.Event
	// queue holds the writes handlers queued with Queue.
	queue *writeQueue
	// htx is the transaction as handlers get it.
	htx *handlerTx
	// scope is the tenant the transaction is scoped to, "" when unknown
	// (after a rollback to a savepoint).
	scope string
	// abort is set when the transaction itself failed (a savepoint could
	// not be rolled back to): the pass must end.
	abort error
	// timedOut is set when a handler failed after the batch deadline.
	timedOut bool
	// savepointed is set while the first savepoint, sent with the shard's
	// lock, is still unused: the first applyUntil takes it instead of
	// sending its own.
	savepointed bool
}

// newRun prepares the handler calls of one pass (or of one replay or
// retry) in tx, whose scope is scope ("" when unknown). Handlers run under
// handlerCtx, with the queue and the store their helpers find there.
func newRun(d *Dispatcher, tx pgx.Tx, sh *shard, scope string, handlerCtx context.Context) *run {
	q := &writeQueue{}
	return &run{
		d: d, tx: tx, sh: sh, scope: scope, queue: q,
		htx:        &handlerTx{Tx: tx, q: q},
		handlerCtx: withStore(context.WithValue(context.WithValue(handlerCtx, queueKey{}, q), shardKey{}, sh.id), d.store),
	}
}

// savepointName is the savepoint of applyUntil at depth.
func savepointName(depth int) string { return "projector_sp" + strconv.Itoa(depth) }

// applyUntil applies events in order under a savepoint. It returns -1 when
// all were applied, else the index of the first event that failed and its
// error; then the effects of the events before it are in place and those of
// the failing event and after are rolled back.
func (r *run) applyUntil(ctx context.Context, events []projector.Event, depth int) (int, error) {
	sp := savepointName(depth)
	if depth == 0 && r.savepointed {
		r.savepointed = false // taken with the shard's lock, nothing written since
	} else if _, err := r.tx.Exec(ctx, "SAVEPOINT "+sp); err != nil {
		r.abort = fmt.Errorf("savepoint: %w", err)
		return 0, r.abort
	}
	k, err := r.apply(ctx, events)
	if err == nil {
		return -1, nil
	}
	if r.handlerCtx.Err() != nil {
		// Past the batch deadline: applying anything again would run under
		// the expired context and fail whatever it touched. The pass
		// handles the timeout as a whole.
		r.timedOut = true
		return k, err
	}
	if _, rerr := r.tx.Exec(ctx, "ROLLBACK TO SAVEPOINT "+sp); rerr != nil {
		r.abort = fmt.Errorf("handler failed (%v) and the transaction could not be rolled back to its savepoint: %w", err, rerr)
		return 0, r.abort
	}
	r.scope = ""
	if len(events) == 1 {
		return 0, err
	}
	if r.sh.proj.t.batch == nil || k >= 0 {
		// Per-event, or a batch whose failing event is known (its decoding
		// failed, or the handler named it: EventFailed): events[:k] went
		// through before; apply them again.
		if k == 0 {
			return 0, err
		}
		if j, err2 := r.applyUntil(ctx, events[:k], depth+1); j >= 0 || r.abort != nil {
			return j, err2
		}
		return k, err
	}
	// A batch handler's failure that names no event: bisect to find the
	// first failing event.
	mid := len(events) / 2
	if j, err2 := r.applyUntil(ctx, events[:mid], depth+1); j >= 0 || r.abort != nil {
		return j, err2
	}
	if j, err2 := r.applyUntil(ctx, events[mid:], depth+1); j >= 0 || r.abort != nil {
		return mid + j, err2
	}
	return -1, nil // failed whole, passed in halves: applied
}

// apply runs the handlers over events. On a failure it returns the index
// of the event that failed: always for per-event handlers; for a batch
// handler when decoding failed or the handler named the event
// ([EventFailed]), else -1.
func (r *run) apply(ctx context.Context, events []projector.Event) (int, error) {
	t := &r.sh.proj.t
	r.queue.reset()
	if t.batch == nil {
		return r.applyEach(ctx, events)
	}
	for i := range events {
		if err := r.decode(&events[i]); err != nil {
			return i, err
		}
	}
	for _, b := range groupBatch(events) {
		if b.Tenant != r.scope {
			if _, err := r.queue.flush(ctx, r.tx); err != nil {
				return -1, err
			}
		}
		if err := r.scopeTo(ctx, b.Tenant); err != nil {
			return -1, err
		}
		r.current = &b.Streams[0].Events[0]
		if err := r.call(r.handlerCtx, func(ctx context.Context) error { return t.batch(ctx, r.htx, b) }); err != nil {
			r.queue.settle()
			return namedIn(events, err), err
		}
	}
	if _, err := r.queue.flush(ctx, r.tx); err != nil {
		return -1, err
	}
	return -1, nil
}

// decode decodes ev's payload into its Go type, unless the projection
// takes raw payloads.
func (r *run) decode(ev *projector.Event) error {
	return decodeEvent(r.d.store.Registry(), r.sh.proj.cfg.RawPayloads, ev)
}

// applyEach runs per-event handlers over events in order. The writes they
// queue are streamed to PostgreSQL while the next events are decoded and
// handled (see writeQueue), so neither side waits for the other; each
// event's payload is decoded just before its handler runs, for the same
// reason. A failure returns the index of the failing event: the first
// event whose queued write failed, if any did, else the event whose
// decoding or handler failed.
func (r *run) applyEach(ctx context.Context, events []projector.Event) (int, error) {
	q := r.queue
	failed := func(i int, err error) (int, error) {
		q.settle()
		if f := q.failed; f != nil {
			return f.owner, f.err // queued by event i or an earlier one
		}
		return i, err
	}
	byType := r.sh.proj.t.byType
	for i := range events {
		ev := &events[i]
		h := byType[ev.Type]
		if h == nil {
			continue // the read filter makes this unreachable
		}
		if ev.Stream.Tenant != r.scope {
			// Queued writes run under the tenant that queued them.
			if k, err := q.flush(ctx, r.tx); err != nil {
				return k, err
			}
			if err := r.scopeTo(ctx, ev.Stream.Tenant); err != nil {
				return i, err
			}
		}
		r.current = ev
		q.current = i
		if err := r.handlerCtx.Err(); err != nil {
			// The deadline passed while an earlier handler ignored it:
			// running more would only lengthen the overrun.
			return failed(i, err)
		}
		if err := r.decode(ev); err != nil {
			return failed(i, err)
		}
		hctx := projector.WithCausationID(projector.WithMetadata(r.handlerCtx, ev.Metadata), ev.ID)
		var span trace.Span // nil unless Config.EventSpans
		if r.d.cfg.EventSpans {
			// Checked here, not only inside: without per-event spans the
			// loop pays no call per event for them.
			hctx, span = r.d.startEventSpan(hctx, r.sh, ev)
		}
		err := r.call(hctx, func(ctx context.Context) error { return h(ctx, r.htx, *ev) })
		if span != nil && err != nil {
			// A span's error is exported: without the event's personal
			// values, as a stored one (errortext.go).
			endEventSpan(span, RedactError(err, OpenedEvents(r.d.store.Registry(), *ev)...))
		} else {
			endEventSpan(span, err)
		}
		if err != nil {
			return failed(i, fmt.Errorf("%s v%d of %s: %w", ev.Type, ev.Version, ev.Stream, err))
		}
		if q.failed != nil {
			// Found by the handler's own use of the transaction.
			return failed(i, nil)
		}
		if len(q.pending) >= streamChunk {
			if q.stream(ctx, r.tx); q.failed != nil {
				return failed(i, nil)
			}
		}
	}
	return q.flush(ctx, r.tx)
}

// call runs a handler, turning a panic into an error.
func (r *run) call(ctx context.Context, fn func(context.Context) error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("panic in handler: %v", p)
			r.d.logger.ErrorContext(ctx, "projection dispatcher: handler panicked", slog.String("consumer", r.sh.id.String()),
				slog.Any("panic", p), slog.String("stack", string(debug.Stack())))
		}
	}()
	return fn(ctx)
}

func (r *run) scopeTo(ctx context.Context, tenant string) error {
	if r.scope == tenant {
		return nil
	}
	if err := r.d.store.ScopeTx(ctx, r.tx, tenant); err != nil {
		return err
	}
	r.scope = tenant
	return nil
}

// unscope returns the transaction to the session's own role before the
// dispatcher writes its own state, which the tenant role has no grants on.
func (r *run) unscope(ctx context.Context) error {
	if r.scope == projector.SystemTenant {
		return nil
	}
	if err := r.d.store.ScopeTx(ctx, r.tx, projector.SystemTenant); err != nil {
		return fmt.Errorf("leave tenant scope: %w", err)
	}
	r.scope = projector.SystemTenant
	return nil
}

// errTxOwned is what a handler gets for trying to end the dispatcher's
// transaction.
var errTxOwned = errors.New("projection: the dispatcher owns this transaction; return an error to roll back instead")

// handlerTx is the dispatcher's transaction as handlers see it: everything
// but ending it. Its statements first settle the writes streamed so far
// (see writeQueue), which hold the connection until their results are
// read; q is nil where nothing is streamed.
type handlerTx struct {
	pgx.Tx
	q *writeQueue
}

func (*handlerTx) Commit(context.Context) error   { return errTxOwned }
func (*handlerTx) Rollback(context.Context) error { return errTxOwned }

func (t *handlerTx) settle() {
	if t.q != nil {
		t.q.settle()
	}
}

func (t *handlerTx) Begin(ctx context.Context) (pgx.Tx, error) {
	t.settle()
	return t.Tx.Begin(ctx)
}

func (t *handlerTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	t.settle()
	return t.Tx.CopyFrom(ctx, table, columns, src)
}

func (t *handlerTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	t.settle()
	return t.Tx.SendBatch(ctx, b)
}

func (t *handlerTx) LargeObjects() pgx.LargeObjects {
	t.settle()
	return t.Tx.LargeObjects()
}

func (t *handlerTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	t.settle()
	return t.Tx.Prepare(ctx, name, sql)
}

func (t *handlerTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	t.settle()
	return t.Tx.Exec(ctx, sql, args...)
}

func (t *handlerTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	t.settle()
	return t.Tx.Query(ctx, sql, args...)
}

func (t *handlerTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	t.settle()
	return t.Tx.QueryRow(ctx, sql, args...)
}

// Conn settles too: the handler may use the connection itself.
func (t *handlerTx) Conn() *pgx.Conn {
	t.settle()
	return t.Tx.Conn()
}
