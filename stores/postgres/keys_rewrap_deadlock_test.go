package postgres_test

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/stores/postgres"
)

// rewrapOutcome is what a rewrap run in the background returned.
type rewrapOutcome struct {
	res postgres.RewrapResult
	err error
}

// rewrapBlockedBy starts a rewrap of r's keys by r.both in batches of two
// and returns once PostgreSQL shows a backend blocked by the backend pid,
// which holds a key row of the rewrap's first batch; the returned function
// waits for the rewrap's end.
func rewrapBlockedBy(t *testing.T, r rotation, pid uint32) func() rewrapOutcome {
	t.Helper()
	done := make(chan rewrapOutcome, 1)
	go func() {
		res, err := r.both.RewrapKeys(r.ctx, postgres.RewrapOptions{BatchSize: 2})
		done <- rewrapOutcome{res, err}
	}()
	blocked := func() bool {
		var yes bool
		if err := r.store.Pool().QueryRow(r.ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity WHERE $1::int = ANY (pg_blocking_pids(pid)))`, int32(pid)).Scan(&yes); err != nil {
			t.Error(err)
			return true
		}
		return yes
	}
	deadline := time.Now().Add(2 * time.Minute)
	for !blocked() {
		select {
		case o := <-done:
			t.Fatalf("the rewrap ended (%+v, %v) while the append held B's key row", o.res, o.err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the rewrap never waited for the append's key row")
		}
		time.Sleep(5 * time.Millisecond) // polling the condition above
	}
	return func() rewrapOutcome {
		select {
		case o := <-done:
			return o
		case <-time.After(2 * time.Minute):
			t.Fatal("the rewrap did not end within two minutes of the append")
			return rewrapOutcome{}
		}
	}
}

// checkRewrapped fails t unless the rewrap rewrapped all 4 keys of r and
// k2 alone opens every customer's events.
func checkRewrapped(t *testing.T, r rotation, o rewrapOutcome) {
	t.Helper()
	if o.err != nil {
		t.Fatalf("the rewrap racing an append for B then A: %v", o.err)
	}
	if o.res.Rewrapped != 4 || o.res.Forgotten != 0 || o.res.Remaining != 0 {
		t.Fatalf("rewrap: %+v, want all 4 keys rewrapped", o.res)
	}
	if n := r.countWrappedBy(t, "k1"); n != 0 {
		t.Fatalf("%d keys still wrapped by k1", n)
	}
	r.checkAll(t, r.open(t, r.k2)) // the appended events too: they are the same customers
}

// TestRewrapNeverDeadlocksAppend: a transaction that appends for subject
// B, then for subject A, while a rewrap batch takes A and B, both commit.
// The transaction holds B's key row FOR SHARE (as every append sealing
// under a key does until it ends) when the batch starts; the test waits
// until the rewrap is blocked behind it, then appends for A. Before, the
// batch's UPDATE had locked A and waited for B, the append waited for A,
// and PostgreSQL failed one of them with a deadlock (40P01); now the batch
// never waits on a key row while holding another: it rewraps the rows it
// can lock at once and waits for each of the others in a transaction of its
// own.
func TestRewrapNeverDeadlocksAppend(t *testing.T) {
	t.Parallel()
	r := rotationSetup(t, 4) // batch 1 of 2 keys: acme/c-00 (A), acme/c-02 (B)
	ctx := r.ctx
	a, b := r.subs["acme/c-00"], r.subs["acme/c-02"]
	tx, err := r.store.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	appendFor := func(c any, id string) error {
		_, err := r.both.Append(ctx, tx, projector.TenantStream("acme", "customer", id), projector.AnyVersion, c)
		return err
	}
	if err := appendFor(b, b.Customer); err != nil {
		t.Fatal(err)
	}
	wait := rewrapBlockedBy(t, r, tx.Conn().PgConn().PID())
	appendErr := appendFor(a, a.Customer)
	if appendErr == nil {
		appendErr = tx.Commit(ctx)
	}
	if appendErr != nil {
		t.Errorf("the append for B then A, racing the rewrap: %v", appendErr)
	}
	checkRewrapped(t, r, wait())
}

// keyReadHook runs hook once, once armed, after the first statement that
// reads (or creates) a subject's key row ends on its connection.
type keyReadHook struct {
	armed atomic.Bool
	once  sync.Once
	hook  func(pid uint32)
}

type sqlKey struct{}

func (h *keyReadHook) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	return context.WithValue(ctx, sqlKey{}, data.SQL)
}

func (h *keyReadHook) TraceQueryEnd(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryEndData) {
	sql, _ := ctx.Value(sqlKey{}).(string)
	if h.armed.Load() && data.Err == nil && strings.Contains(sql, "projector_subject_keys") && strings.Contains(sql, "FOR SHARE") {
		h.once.Do(func() { h.hook(conn.PgConn().PID()) })
	}
}

// TestRewrapNeverDeadlocksMultiSubjectAppend: one append sealing events of
// subjects B and A, in that order, while a rewrap batch takes A and B,
// commits, and so does the rewrap. The append's store traces its
// connection: after the statement that reads (and locks) B's key, it waits
// until the rewrap is blocked behind it, then goes on to A's key. Before,
// PostgreSQL failed the append or the rewrap with a deadlock (40P01).
func TestRewrapNeverDeadlocksMultiSubjectAppend(t *testing.T) {
	t.Parallel()
	r := rotationSetup(t, 4) // batch 1 of 2 keys: acme/c-00 (A), acme/c-02 (B)
	ctx := r.ctx
	a, b := r.subs["acme/c-00"], r.subs["acme/c-02"]
	var wait func() rewrapOutcome
	hook := &keyReadHook{hook: func(pid uint32) { wait = rewrapBlockedBy(t, r, pid) }}
	cfg := pgtest.PoolConfig(t)
	cfg.ConnConfig.Tracer = hook
	pool := pgtest.PoolFromConfig(t, cfg)
	appender, err := postgres.New(ctx, pool, postgres.Config{Schema: r.store.Schema(), Registry: r.types.Registry,
		MasterKey: r.k2, OldMasterKeys: []*postgres.MasterKey{r.k1}})
	if err != nil {
		t.Fatal(err)
	}
	hook.armed.Store(true)
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := appender.Append(ctx, tx, projector.TenantStream("acme", "customer", "both"), projector.AnyVersion, b, a)
		return err
	})
	if err != nil {
		t.Errorf("the append for B and A, racing the rewrap: %v", err)
	}
	if wait == nil {
		t.Fatal("the append read no key")
	}
	checkRewrapped(t, r, wait())
}
