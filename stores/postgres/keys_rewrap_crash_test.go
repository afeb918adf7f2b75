package postgres_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/stores/postgres"
)

// The rewrap helper process's settings: the database and the schema.
const (
	rewrapChildEnv    = "PROJECTOR_TEST_REWRAP_CHILD_URL"
	rewrapChildSchema = "PROJECTOR_TEST_REWRAP_CHILD_SCHEMA"
	rewrapChildBatch  = 10
)

// rewrapChild rewraps the schema's keys from k1 to k2 in batches of
// rewrapChildBatch, paced so the parent can kill it in the middle.
func rewrapChild() int {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv(rewrapChildEnv))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer pool.Close()
	k1, _ := postgres.NewMasterKey("k1", testevents.MasterKey("one"))
	k2, _ := postgres.NewMasterKey("k2", testevents.MasterKey("two"))
	store, err := postgres.New(ctx, pool, postgres.Config{Schema: os.Getenv(rewrapChildSchema), Registry: testevents.NewPersonal().Registry,
		MasterKey: k2, OldMasterKeys: []*postgres.MasterKey{k1}})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	store.Keys().(*postgres.KeyTable).SetRewrapHook(func(context.Context, int) error {
		time.Sleep(20 * time.Millisecond) // pacing, not synchronisation
		return nil
	})
	res, err := store.RewrapKeys(ctx, postgres.RewrapOptions{BatchSize: rewrapChildBatch})
	fmt.Printf("rewrap: %+v %v\n", res, err)
	if err != nil {
		return 1
	}
	return 0
}

// TestRewrapCrashResumes SIGKILLs a process in the middle of a rewrap and
// runs the rewrap again: the killed run left whole batches only, the
// second rewraps the rest, and k2 alone then opens every event.
func TestRewrapCrashResumes(t *testing.T) {
	t.Parallel()
	const subjects = 200
	r := rotationSetup(t, 0)
	err := pgx.BeginFunc(r.ctx, r.old.Pool(), func(tx pgx.Tx) error {
		for i := range subjects {
			c := testevents.CustomerRegistered{Customer: fmt.Sprintf("s-%03d", i), Name: fmt.Sprintf("Name %d", i), Email: "e@x", Plan: "pro"}
			if _, err := r.old.Append(r.ctx, tx, projector.TenantStream("acme", "customer", c.Customer), projector.NoStream, c); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	child := pgtest.StartChild(t, rewrapChildEnv+"="+pgtest.URL(t), rewrapChildSchema+"="+r.store.Schema())
	for deadline := time.Now().Add(time.Minute); r.countWrappedBy(t, "k2") < 3*rewrapChildBatch; {
		select {
		case <-child.Done():
			t.Fatalf("the rewrap ended before it could be killed:\n%s", child.Output())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the rewrap rewrapped nothing within a minute")
		}
		time.Sleep(5 * time.Millisecond) // polling with a deadline
	}
	child.Kill(t)
	killed := r.countWrappedBy(t, "k2")
	t.Logf("killed after %d of %d keys", killed, subjects)
	if killed%rewrapChildBatch != 0 || killed >= subjects || killed+r.countWrappedBy(t, "k1") != subjects {
		t.Fatalf("the killed rewrap left %d keys under k2 and %d under k1: want whole batches of %d, not all %d",
			killed, r.countWrappedBy(t, "k1"), rewrapChildBatch, subjects)
	}
	res, err := r.both.RewrapKeys(r.ctx, postgres.RewrapOptions{BatchSize: rewrapChildBatch})
	if err != nil || res.Rewrapped != int64(subjects-killed) || res.Remaining != 0 {
		t.Fatalf("resumed rewrap after %d: %+v %v", killed, res, err)
	}
	evs := readLogN(t, r.ctx, r.open(t, r.k2), postgres.LogQuery{Limit: 1000}, subjects)
	for _, ev := range evs {
		c := ev.Payload.(testevents.CustomerRegistered)
		if ev.Forgotten || c.Name != fmt.Sprintf("Name %d", atoi(c.Customer[2:])) {
			t.Fatalf("with k2 alone, event of %s reads %+v (forgotten %v)", c.Customer, c, ev.Forgotten)
		}
	}
}

func atoi(s string) int {
	var n int
	_, _ = fmt.Sscanf(s, "%d", &n)
	return n
}
