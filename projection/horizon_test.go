package projection_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgserver"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

// ownCluster starts a throwaway cluster with two-phase commit enabled (the
// shared test server has max_prepared_transactions = 0) and nothing else
// running, so the oldest transaction in it is the test's.
func ownCluster(t *testing.T) *pgserver.Server {
	t.Helper()
	if _, err := pgserver.FindBinaries(); errors.Is(err, pgserver.ErrNoBinaries) && os.Getenv("CI") != "true" {
		t.Skip("no local PostgreSQL binaries")
	}
	srv, err := pgserver.Start(context.Background(), "max_prepared_transactions=10")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := srv.Stop(); err != nil {
			t.Errorf("stop cluster: %v", err)
		}
	})
	return srv
}

// urlFor is the cluster's URL for another database and user.
func urlFor(srv *pgserver.Server, db, user string) string {
	u := strings.Replace(srv.URL, "postgres://postgres@/postgres?", "postgres://"+user+"@/"+db+"?", 1)
	return u
}

func connect(t *testing.T, url, app string) *pgx.Conn {
	t.Helper()
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["application_name"] = app
	conn, err := pgx.ConnectConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// holdXid opens a transaction on conn and gives it an id: from then on it
// holds every consumer's horizon back, whatever database it is in.
func holdXid(t *testing.T, conn *pgx.Conn) (pid uint32) {
	t.Helper()
	ctx := context.Background()
	if _, err := conn.Exec(ctx, `BEGIN`); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `SELECT pg_current_xact_id() /* horizon-holder-test */`); err != nil {
		t.Fatal(err)
	}
	return conn.PgConn().PID()
}

// The horizon report names the transaction holding the horizon: a session
// in another database of the cluster, with its pid, database, user,
// application, state and query; a prepared transaction by its gid; and,
// for a role that cannot see other roles' sessions, says what is missing
// instead of naming nobody.
func TestHorizonNamesTheHolder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := ownCluster(t)
	pool, err := pgxpool.New(ctx, srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	for _, sql := range []string{`CREATE DATABASE elsewhere`, `CREATE ROLE watcher LOGIN`, `CREATE TABLE twophase (n int)`} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}

	rep, err := projection.Horizon(ctx, pool)
	if err != nil || rep.Holder != nil || rep.Missing != "" || rep.AgeSeconds != 0 {
		t.Fatalf("quiet cluster: %+v, %v", rep, err)
	}

	// A session of another database holds an xid.
	other := connect(t, urlFor(srv, "elsewhere", "postgres"), "stuck-report")
	pid := holdXid(t, other)
	rep, err = projection.Horizon(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	h := rep.Holder
	if h == nil || h.Kind != projection.HolderSession || uint32(h.PID) != pid || h.Database != "elsewhere" || h.User != "postgres" ||
		rep.AgeSeconds <= 0 || h.ApplicationName != "stuck-report" || h.State != "idle in transaction" || !strings.Contains(h.Query, "horizon-holder-test") || h.Since.IsZero() || h.TxID == 0 {
		t.Fatalf("holder: %+v (report %+v), want the session %d in elsewhere", h, rep, pid)
	}

	// A role without pg_read_all_stats is told what it cannot see.
	watcher, err := pgxpool.New(ctx, urlFor(srv, "postgres", "watcher"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(watcher.Close)
	rep, err = projection.Horizon(ctx, watcher)
	if err != nil || rep.Holder == nil || uint32(rep.Holder.PID) != pid || !rep.Holder.Hidden || rep.Holder.Query != "" ||
		rep.Holder.Database != "elsewhere" || !strings.Contains(rep.Missing, "pg_read_all_stats") {
		t.Fatalf("as watcher: %+v %+v, %v", rep, rep.Holder, err)
	}
	if _, err := pool.Exec(ctx, `GRANT pg_read_all_stats TO watcher`); err != nil {
		t.Fatal(err)
	}
	rep, err = projection.Horizon(ctx, watcher)
	if err != nil || rep.Holder == nil || uint32(rep.Holder.PID) != pid || rep.Holder.Hidden || !strings.Contains(rep.Holder.Query, "horizon-holder-test") || rep.Missing != "" {
		t.Fatalf("as watcher with pg_read_all_stats: %+v, %v", rep, err)
	}

	// A prepared transaction, once the session is gone, holds it alone.
	prep := connect(t, srv.URL, "preparer")
	if _, err := prep.Exec(ctx, `BEGIN`); err != nil {
		t.Fatal(err)
	}
	if _, err := prep.Exec(ctx, `INSERT INTO twophase VALUES (1)`); err != nil {
		t.Fatal(err)
	}
	if _, err := prep.Exec(ctx, `PREPARE TRANSACTION 'horizon-test-gid'`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), `ROLLBACK PREPARED 'horizon-test-gid'`) })
	rep, err = projection.Horizon(ctx, pool)
	if err != nil || rep.Holder == nil || uint32(rep.Holder.PID) != pid || len(rep.Others) != 1 || rep.Others[0].GID != "horizon-test-gid" {
		t.Fatalf("session and prepared: %+v, %v", rep, err)
	}
	if _, err := other.Exec(ctx, `ROLLBACK`); err != nil {
		t.Fatal(err)
	}
	rep, err = projection.Horizon(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if h := rep.Holder; h == nil || h.Kind != projection.HolderPrepared || h.GID != "horizon-test-gid" || h.Database != "postgres" || h.PID != 0 || h.Since.IsZero() {
		t.Fatalf("prepared holder: %+v (report %+v)", h, rep)
	}
	if _, err := pool.Exec(ctx, `ROLLBACK PREPARED 'horizon-test-gid'`); err != nil {
		t.Fatal(err)
	}
	if rep, err := projection.Horizon(ctx, pool); err != nil || rep.Holder != nil {
		t.Fatalf("after the rollback: %+v, %v", rep, err)
	}
}

// The dispatcher's metrics name the holder too, within one refresh, and
// drop the series when it is gone.
func TestHorizonHolderMetric(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := ownCluster(t)
	pool, err := pgxpool.New(ctx, srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := pool.Exec(ctx, `CREATE DATABASE elsewhere`); err != nil {
		t.Fatal(err)
	}
	if _, err := postgres.Migrate(ctx, pool, "projector"); err != nil {
		t.Fatal(err)
	}
	types := testevents.New()
	store, err := postgres.New(ctx, pool, postgres.Config{Schema: "projector", Registry: types.Registry})
	if err != nil {
		t.Fatal(err)
	}
	p := projection.NewAsync("noop", projection.AsyncConfig{})
	must(projection.OnEvent(p, types.Opened, func(context.Context, pgx.Tx, projector.Event) error { return nil }))
	reg := prometheus.NewRegistry()
	e := &env{t: t, ctx: ctx, types: types, schema: "projector", store: store}
	e.dispatcher(projection.Config{Projections: []*projection.Async{p}, Registerer: reg, MetricsEvery: 20 * time.Millisecond})
	holder := func() map[string]string {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if ms := mf.GetMetric(); mf.GetName() == "projector_horizon_holder_age_seconds" && len(ms) > 0 {
				labels := map[string]string{}
				for _, l := range ms[0].GetLabel() {
					labels[l.GetName()] = l.GetValue()
				}
				return labels
			}
		}
		return nil
	}
	other := connect(t, urlFor(srv, "elsewhere", "postgres"), "stuck-report")
	pid := holdXid(t, other)
	eventually(t, 30*time.Second, "the holder metric to name the session", func() bool {
		l := holder()
		return l["pid"] == fmt.Sprint(pid) && l["database"] == "elsewhere" && l["application_name"] == "stuck-report" && l["kind"] == "session"
	})
	if _, err := other.Exec(ctx, `ROLLBACK`); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the holder series to go", func() bool { return holder() == nil })
}

// TestHorizonHolderThatEndsMidReportIsNotCalledInvisible: the report reads
// the horizon from its snapshot and the sessions from pg_stat_activity, a
// moment later. Under ordinary append traffic the holder often commits in
// between; a role that sees every session must then not be told the holder
// is "not visible to this role" (the newcomer pass saw that line, as a
// superuser, from `projector horizon` while one process appended): the
// oldest transaction still running holds the horizon now, and is named.
// A repeatable-read transaction pins the snapshot before the holder ends,
// so the race is taken every time.
func TestHorizonHolderThatEndsMidReportIsNotCalledInvisible(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := ownCluster(t)
	first := connect(t, srv.URL, "first-holder")
	holdXid(t, first)
	second := connect(t, srv.URL, "second-holder")
	pid := holdXid(t, second)

	reader := connect(t, srv.URL, "reporter")
	tx, err := reader.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if _, err := tx.Exec(ctx, `SELECT 1`); err != nil { // the snapshot: first holds the horizon
		t.Fatal(err)
	}
	if _, err := first.Exec(ctx, `COMMIT`); err != nil {
		t.Fatal(err)
	}
	rep, err := projection.Horizon(ctx, tx)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Missing != "" || rep.Holder == nil || uint32(rep.Holder.PID) != pid || len(rep.Others) != 0 {
		t.Fatalf("report %+v (holder %+v): want the second session %d named as the holder, nothing missing", rep, rep.Holder, pid)
	}
}
