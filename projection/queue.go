package projection

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

type queueKey struct{}

// Queue adds a write to the current batch instead of running it at once:
// the dispatcher pipelines every statement its handlers queued, in the
// order they were queued, all of them before the cursor moves, in the same
// transaction. A per-event handler that writes this way costs no round
// trip of its own, which is most of a per-event handler's time.
//
// Queued writes may not be visible to reads made by handlers of the same
// batch (some may have run, some not yet); queue only what the batch does
// not read back. A queued statement that fails fails the event whose
// handler queued it, like a returned error. Queue works only in handlers
// run by a dispatcher ([ErrNoDispatcher] elsewhere, such as in inline
// projections).
func Queue(ctx context.Context, sql string, args ...any) error {
	q, ok := ctx.Value(queueKey{}).(*writeQueue)
	if !ok {
		return ErrNoDispatcher
	}
	q.pending = append(q.pending, queuedWrite{sql: sql, args: args, owner: q.current})
	return nil
}

// streamChunk is how many queued statements a per-event pass lets gather
// before it sends them on, while its handlers go on with the next events.
// Sending each statement alone would cost a write system call per event;
// waiting for the end of the batch leaves PostgreSQL idle while the
// handlers run (and the handlers idle while it runs the statements).
const streamChunk = 64

// maxQueueStatements bounds the statements the stream prepares on one
// connection over its life: a handler that builds its SQL text per event
// would otherwise fill the server session with prepared statements. Past
// the bound, statements of new text go out as before streaming, through a
// pgx.Batch (and its bounded statement cache) at the end of the batch.
const maxQueueStatements = 256

// writeQueue is one pass's queued writes. Per-event handlers' writes are
// streamed: once streamChunk statements are pending, the pass sends them
// into a pipeline on the transaction's connection without waiting for
// their results, and PostgreSQL runs them while the next handlers run. The
// results are read (settled) at the end of the batch, before a tenant
// switch, and before a handler uses the transaction itself, which the open
// pipeline would otherwise refuse. Until settled, a statement's failure is
// unknown; the first one found fails the event that queued it, and as
// PostgreSQL runs nothing after it, no later queued write takes effect.
type writeQueue struct {
	// pending are the statements queued and not sent yet, in order.
	pending []queuedWrite
	// current is the index of the event whose handler is running.
	current int

	// pipe is the open pipeline the statements of sent went into; their
	// results are not read yet.
	pipe *pgconn.Pipeline
	sent []int // owners of the statements in pipe, in order
	// failed holds the first failure found (owner is its event), which
	// ends the streaming of this apply.
	failed *queueFailure
	// cs is what the transaction's connection has prepared for the
	// stream, once stream ran.
	cs *connStatements

	eqb pgx.ExtendedQueryBuilder
}

type queuedWrite struct {
	sql   string
	args  []any
	owner int // index of the event whose handler queued it
}

type queueFailure struct {
	owner int
	err   error
}

func (q *writeQueue) reset() {
	clear(q.pending) // let the arguments go
	q.pending, q.sent, q.current, q.failed = q.pending[:0], q.sent[:0], 0, nil
}

// fail records err as the failure of the write of owner, unless an earlier
// one is recorded: the first failure in queue order is the one PostgreSQL
// stopped at.
func (q *writeQueue) fail(owner int, err error) {
	if q.cs != nil {
		q.cs.forget(err)
	}
	if q.failed == nil || owner < q.failed.owner {
		q.failed = &queueFailure{owner: owner, err: fmt.Errorf("queued write: %w", err)}
	}
}

// connStatements is what the stream prepared on one connection, kept in
// the connection's pgconn.CustomData so that it lives and dies with the
// session that holds the prepared statements.
type connStatements struct {
	bySQL  map[string]*pgconn.StatementDescription
	issued int // names handed out, never reused
	// off is set when the connection is configured for something other
	// than pgx's cached prepared statements (a simple or describe-only
	// exec mode for a pooler, or a tracer that expects to see every
	// statement): the queue then leaves everything to pgx.Batch.
	off bool
}

const connStatementsKey = "github.com/projectorhq/projector/projection.queue"

func statementsOf(conn *pgx.Conn) *connStatements {
	data := conn.PgConn().CustomData()
	if cs, ok := data[connStatementsKey].(*connStatements); ok {
		return cs
	}
	cfg := conn.Config()
	cs := &connStatements{
		bySQL: map[string]*pgconn.StatementDescription{},
		off:   cfg.DefaultQueryExecMode != pgx.QueryExecModeCacheStatement || cfg.StatementCacheCapacity == 0 || cfg.Tracer != nil,
	}
	data[connStatementsKey] = cs
	return cs
}

// forget drops every description after an error saying the session lost
// a prepared statement or a plan's result changed: the next use prepares
// the statement again under a new name.
func (cs *connStatements) forget(err error) {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == "26000" || pgErr.Code == "0A000") {
		clear(cs.bySQL)
	}
}

// stream sends the pending statements into the pipeline, preparing the
// ones whose text the connection has not seen. It stops at the first
// statement it cannot stream (past maxQueueStatements): that one and those
// after it wait for flush, so the statements still run in queue order.
func (q *writeQueue) stream(ctx context.Context, tx pgx.Tx) {
	if q.failed != nil || len(q.pending) == 0 {
		return
	}
	conn := tx.Conn()
	cs := statementsOf(conn)
	if cs.off {
		return
	}
	q.cs = cs
	n, ok := q.prepare(ctx, conn, cs)
	if !ok || n == 0 {
		return
	}
	for i := range n {
		w := &q.pending[i]
		sd := cs.bySQL[w.sql]
		if err := q.eqb.Build(conn.TypeMap(), sd, w.args); err != nil {
			n = i
			q.fail(w.owner, err)
			break
		}
		if q.pipe == nil {
			q.pipe = conn.PgConn().StartPipeline(ctx)
		}
		var resultFormats []int16
		if len(q.eqb.ResultFormats) > 0 {
			// The pipeline keeps it until the result is read; Build
			// reuses its array.
			resultFormats = append(resultFormats, q.eqb.ResultFormats...)
		}
		q.pipe.SendQueryStatement(sd, q.eqb.ParamValues, q.eqb.ParamFormats, resultFormats)
		q.sent = append(q.sent, w.owner)
	}
	if q.pipe != nil {
		if err := q.pipe.Flush(); err != nil {
			q.fail(q.sent[0], err) // the connection is gone
		}
	}
	q.pending = append(q.pending[:0], q.pending[n:]...)
}

// prepare makes sure the connection has a prepared statement for each
// pending statement it can stream, rewriting those whose first argument is
// a pgx.QueryRewriter (pgx.NamedArgs) as pgx would. It returns how many
// leading pending statements can be streamed, and false when it failed
// (recorded in q.failed).
func (q *writeQueue) prepare(ctx context.Context, conn *pgx.Conn, cs *connStatements) (int, bool) {
	var fresh []*pgconn.StatementDescription
	n := 0
	for i := range q.pending {
		w := &q.pending[i]
		if len(w.args) > 0 {
			if rw, ok := w.args[0].(pgx.QueryRewriter); ok {
				sql, args, err := rw.RewriteQuery(ctx, conn, w.sql, w.args[1:])
				if err != nil {
					q.fail(w.owner, fmt.Errorf("rewrite query: %w", err))
					return 0, false
				}
				w.sql, w.args = sql, args
			}
		}
		if _, ok := cs.bySQL[w.sql]; !ok {
			if cs.issued >= maxQueueStatements {
				break
			}
			sd := &pgconn.StatementDescription{Name: "projector_queue_" + strconv.Itoa(cs.issued), SQL: w.sql}
			cs.issued++
			cs.bySQL[w.sql] = sd
			fresh = append(fresh, sd)
		}
		n++
	}
	if len(fresh) == 0 {
		return n, true
	}
	// A prepare needs its own round trip (the statement's parameter types
	// decide how its arguments are encoded): read what was sent first.
	q.settle()
	if q.failed != nil {
		for _, sd := range fresh {
			delete(cs.bySQL, sd.SQL)
		}
		return 0, false
	}
	p := conn.PgConn().StartPipeline(ctx)
	for _, sd := range fresh {
		p.SendPrepare(sd.Name, sd.SQL, nil)
	}
	err := p.Sync()
	for i := 0; err == nil && i < len(fresh); i++ {
		var res any
		if res, err = p.GetResults(); err == nil {
			if got, ok := res.(*pgconn.StatementDescription); ok {
				fresh[i].ParamOIDs, fresh[i].Fields = got.ParamOIDs, got.Fields
			} else {
				err = fmt.Errorf("prepare: unexpected pipeline result %T", res)
			}
		}
		if err != nil {
			// Blame the first event that queued the statement that did
			// not prepare.
			for _, w := range q.pending {
				if w.sql == fresh[i].SQL {
					q.fail(w.owner, fmt.Errorf("prepare: %w", err))
					break
				}
			}
		}
	}
	if err == nil {
		var res any
		if res, err = p.GetResults(); err == nil {
			if _, ok := res.(*pgconn.PipelineSync); !ok {
				err = fmt.Errorf("prepare: unexpected pipeline result %T", res)
			}
		}
		if err != nil {
			q.fail(q.pending[0].owner, fmt.Errorf("prepare: %w", err))
		}
	}
	if cerr := p.Close(); cerr != nil && q.failed == nil {
		q.fail(q.pending[0].owner, fmt.Errorf("prepare: %w", cerr))
	}
	if q.failed != nil {
		for _, sd := range fresh {
			delete(cs.bySQL, sd.SQL)
		}
		return 0, false
	}
	return n, true
}

// settle ends the open pipeline, if any: it marks the end of what was sent,
// reads every result in order and records the first failure. The
// connection is free for other statements afterwards.
func (q *writeQueue) settle() {
	p := q.pipe
	if p == nil {
		return
	}
	q.pipe = nil
	sent := q.sent
	q.sent = q.sent[:0]
	read := 0
	err := p.Sync()
	for err == nil && read < len(sent) {
		var res any
		if res, err = p.GetResults(); err != nil {
			break
		}
		rr, ok := res.(*pgconn.ResultReader)
		if !ok {
			err = fmt.Errorf("unexpected pipeline result %T", res)
			break
		}
		if _, err = rr.Close(); err == nil {
			read++
		}
	}
	if err == nil {
		var res any
		if res, err = p.GetResults(); err == nil {
			if _, ok := res.(*pgconn.PipelineSync); !ok {
				err = fmt.Errorf("unexpected pipeline result %T", res)
			}
		}
	}
	// Close reads whatever an error left unread, up to the Sync.
	if cerr := p.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		q.fail(sent[min(read, len(sent)-1)], err)
	}
}

// flush sends the queued writes and reads their results; on a failure it
// returns the index of the event that queued the failing statement. The
// queue is empty afterwards.
func (q *writeQueue) flush(ctx context.Context, tx pgx.Tx) (int, error) {
	q.stream(ctx, tx)
	q.settle()
	if f := q.failed; f != nil {
		q.reset()
		return f.owner, f.err
	}
	k, err := q.flushBatch(ctx, tx)
	q.reset()
	return k, err
}

// flushBatch sends what stream could not (all of it on a connection it
// leaves to pgx) as one pgx.Batch.
func (q *writeQueue) flushBatch(ctx context.Context, tx pgx.Tx) (int, error) {
	n := len(q.pending)
	if n == 0 {
		return -1, nil
	}
	b := &pgx.Batch{}
	for _, w := range q.pending {
		b.Queue(w.sql, w.args...)
	}
	br := tx.SendBatch(ctx, b)
	for j := range n {
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			return q.pending[j].owner, fmt.Errorf("queued write: %w", err)
		}
	}
	if err := br.Close(); err != nil {
		return q.pending[n-1].owner, fmt.Errorf("queued writes: %w", err)
	}
	return -1, nil
}
