package postgres_test

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"maps"
	"strings"
	"testing"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/stores/postgres"
)

// rotation is a schema whose keys were made under master key k1, and the
// stores that see it through a rotation to k2.
type rotation struct {
	personalFixture
	k1, k2 *postgres.MasterKey
	old    *postgres.Store // k1 only: before the rotation
	both   *postgres.Store // k2, with k1 as an old key: during it
	subs   map[string]testevents.CustomerRegistered
}

// rotationSetup registers n customers of tenants acme and globex under k1.
func rotationSetup(t *testing.T, n int) rotation {
	t.Helper()
	f := personalSetup(t) // its store has k1
	r := rotation{personalFixture: f, k1: masterKey(t, "k1", "one"), k2: masterKey(t, "k2", "two"),
		old: f.store, subs: map[string]testevents.CustomerRegistered{}}
	for i := range n {
		c := testevents.CustomerRegistered{Customer: fmt.Sprintf("c-%02d", i), Name: fmt.Sprintf("Name %d", i),
			Email: fmt.Sprintf("%d@x", i), Plan: "pro"}
		tenant := []string{"acme", "globex"}[i%2]
		if err := f.register(t, f.store, tenant, c); err != nil {
			t.Fatal(err)
		}
		r.subs[tenant+"/"+c.Customer] = c
	}
	r.both = r.open(t, r.k2, r.k1)
	return r
}

// open opens a store on the schema with master key master and old keys.
func (r rotation) open(t *testing.T, master *postgres.MasterKey, old ...*postgres.MasterKey) *postgres.Store {
	t.Helper()
	s, err := postgres.New(r.ctx, r.store.Pool(), postgres.Config{Schema: r.store.Schema(), Registry: r.types.Registry,
		MasterKey: master, OldMasterKeys: old, AllowNoMasterKey: master == nil})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func keyTable(t *testing.T, s *postgres.Store) *postgres.KeyTable {
	t.Helper()
	kt, ok := s.Keys().(*postgres.KeyTable)
	if !ok {
		t.Fatalf("keys are a %T", s.Keys())
	}
	return kt
}

// keyRows returns master_key_id and wrapped of every key row, by tenant/subject.
func (r rotation) keyRows(t *testing.T) map[string]string {
	t.Helper()
	rows, err := r.store.Pool().Query(r.ctx, `SELECT tenant_id || '/' || subject, master_key_id || ':' || coalesce(encode(wrapped, 'hex'), 'forgotten')
		FROM `+r.store.Table("projector_subject_keys"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for rows.Next() {
		var k, v string
		if err := rows.Scan(&k, &v); err != nil {
			t.Fatal(err)
		}
		out[k] = v
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// countWrappedBy counts the live keys wrapped by master key id.
func (r rotation) countWrappedBy(t *testing.T, id string) int {
	t.Helper()
	var n int
	err := r.store.Pool().QueryRow(r.ctx, `SELECT count(*) FROM `+r.store.Table("projector_subject_keys")+`
		WHERE wrapped IS NOT NULL AND master_key_id = $1`, id).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// checkAll reads every customer through s and compares with what was
// registered; forgotten ones must read as forgotten.
func (r rotation) checkAll(t *testing.T, s *postgres.Store, forgotten ...string) {
	t.Helper()
	gone := map[string]bool{}
	for _, f := range forgotten {
		gone[f] = true
	}
	for key, c := range r.subs {
		tenant := key[:len(key)-len(c.Customer)-1]
		evs := readCustomer(t, s, tenant, c.Customer)
		if len(evs) == 0 {
			t.Fatalf("%s: no events", key)
		}
		for _, ev := range evs {
			switch {
			case gone[key] && (!ev.Forgotten || ev.Payload.(testevents.CustomerRegistered).Name != ""):
				t.Errorf("%s: forgotten, but reads %+v", key, ev.Payload)
			case !gone[key] && (ev.Forgotten || ev.Payload != c):
				t.Errorf("%s: reads %+v (forgotten %v), want %+v", key, ev.Payload, ev.Forgotten, c)
			}
		}
	}
}

// TestRewrapKeys: with k2 as the master key and k1 as an old one, reads
// open keys of both, new keys are wrapped by k2, and the rewrap moves every
// k1 key to k2 in batches while appends and reads go on; afterwards k2
// alone opens everything, k1 alone nothing, and a second rewrap is a no-op.
func TestRewrapKeys(t *testing.T) {
	t.Parallel()
	r := rotationSetup(t, 7)
	r.checkAll(t, r.both) // reads work with old and new configured
	add := func(id string) {
		t.Helper()
		c := testevents.CustomerRegistered{Customer: id, Name: "New " + id, Email: id + "@x", Plan: "free"}
		if err := r.register(t, r.both, "acme", c); err != nil {
			t.Fatal(err)
		}
		r.subs["acme/"+id] = c
	}
	add("n-1")
	if got := r.keyRows(t)["acme/n-1"]; got[:3] != "k2:" {
		t.Fatalf("a key created during the rotation is %s, want wrapped by k2", got)
	}
	var batches []int
	keyTable(t, r.both).SetRewrapHook(func(ctx context.Context, batch int) error {
		batches = append(batches, batch)
		if batch == 2 { // appends and reads go on during the rotation
			add("n-2")
			r.checkAll(t, r.both)
		}
		return nil
	})
	var progress []int64
	res, err := r.both.RewrapKeys(r.ctx, postgres.RewrapOptions{BatchSize: 3, Progress: func(p postgres.RewrapResult) {
		progress = append(progress, p.Rewrapped)
	}})
	if err != nil {
		t.Fatal(err)
	}
	if res.MasterKeyID != "k2" || !maps.Equal(res.Pending, map[string]int64{"k1": 7}) || res.Rewrapped != 7 ||
		res.Forgotten != 0 || res.Batches != 3 || res.Remaining != 0 {
		t.Fatalf("rewrap: %+v", res)
	}
	if fmt.Sprint(progress) != "[3 6 7]" || fmt.Sprint(batches) != "[1 2 3]" {
		t.Fatalf("progress %v, batches %v", progress, batches)
	}
	if n := r.countWrappedBy(t, "k1"); n != 0 {
		t.Fatalf("%d keys still wrapped by k1", n)
	}
	r.checkAll(t, r.open(t, r.k2))
	r.checkAll(t, r.both)
	// Its cache held the k1-wrapped rows: an append under a cached key
	// finds the row changed, and starts over reading the key.
	c := r.subs["acme/c-00"]
	if err := r.register(t, r.both, "acme", c); err != nil {
		t.Fatal(err)
	}
	r.checkAll(t, r.open(t, r.k2))
	if _, err := r.old.ReadStream(r.ctx, projector.TenantStream("acme", "customer", "c-00"), postgres.StreamQuery{}); !errors.Is(err, postgres.ErrMasterKeyChanged) {
		t.Fatalf("k1 alone after the rotation: %v, want ErrMasterKeyChanged", err)
	}
	before := r.keyRows(t)
	for _, s := range []*postgres.Store{r.both, r.open(t, r.k2)} {
		res, err = s.RewrapKeys(r.ctx, postgres.RewrapOptions{})
		if err != nil || len(res.Pending) != 0 || res.Rewrapped != 0 || res.Batches != 0 {
			t.Fatalf("second rewrap: %+v %v", res, err)
		}
	}
	if !maps.Equal(before, r.keyRows(t)) {
		t.Fatal("a rewrap with nothing to do changed key rows")
	}
}

// TestRewrapNeverResurrectsForget: a forget that commits between a rewrap
// batch's read of the key rows and its write stays forgotten; the rewrap
// counts it and goes on without an error.
func TestRewrapNeverResurrectsForget(t *testing.T) {
	t.Parallel()
	r := rotationSetup(t, 4)
	victim := postgres.SubjectRef{Tenant: "globex", ID: "c-01"}
	keyTable(t, r.both).SetRewrapHook(func(ctx context.Context, batch int) error {
		if batch == 1 {
			_, err := r.old.Forget(ctx, victim) // its own transaction: it commits now
			return err
		}
		return nil
	})
	res, err := r.both.RewrapKeys(r.ctx, postgres.RewrapOptions{BatchSize: 10})
	if err != nil {
		t.Fatal(err)
	}
	if res.Rewrapped != 3 || res.Forgotten != 1 || res.Remaining != 0 {
		t.Fatalf("rewrap: %+v", res)
	}
	if got := r.keyRows(t)[victim.String()]; got != "k1:forgotten" {
		t.Fatalf("the forgotten subject's key row is %s after the rewrap", got)
	}
	r.checkAll(t, r.open(t, r.k2), "globex/c-01")
}

// TestRewrapResumes: a rewrap whose context is cancelled in the middle of
// its third batch has committed two batches and nothing of the third; run
// again, it rewraps the rest, and k2 alone opens every key.
func TestRewrapResumes(t *testing.T) {
	t.Parallel()
	r := rotationSetup(t, 10)
	ctx, cancel := context.WithCancel(r.ctx)
	defer cancel()
	kt := keyTable(t, r.both)
	kt.SetRewrapHook(func(ctx context.Context, batch int) error {
		if batch == 3 {
			cancel()
			return ctx.Err()
		}
		return nil
	})
	res, err := r.both.RewrapKeys(ctx, postgres.RewrapOptions{BatchSize: 3})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled rewrap: %+v %v", res, err)
	}
	if res.Rewrapped != 6 || r.countWrappedBy(t, "k2") != 6 || r.countWrappedBy(t, "k1") != 4 {
		t.Fatalf("after the cancel: %+v, k2 %d, k1 %d", res, r.countWrappedBy(t, "k2"), r.countWrappedBy(t, "k1"))
	}
	r.checkAll(t, r.both)
	kt.SetRewrapHook(nil)
	res, err = r.both.RewrapKeys(r.ctx, postgres.RewrapOptions{BatchSize: 3})
	if err != nil || res.Rewrapped != 4 || !maps.Equal(res.Pending, map[string]int64{"k1": 4}) {
		t.Fatalf("resumed rewrap: %+v %v", res, err)
	}
	r.checkAll(t, r.open(t, r.k2))
}

// TestRewrapBadKeys: a wrong old key (same id, other bytes), a key id the
// process does not have, no master key or a bad batch size are clear
// errors and change nothing; a key list that names an id twice is refused
// at start.
func TestRewrapBadKeys(t *testing.T) {
	t.Parallel()
	r := rotationSetup(t, 3)
	// One key of another old master key, k0, sorting after k1's.
	k0 := masterKey(t, "k0", "zero")
	z := testevents.CustomerRegistered{Customer: "z-9", Name: "Zed", Email: "z@x", Plan: "pro"}
	if err := r.register(t, r.open(t, k0), "globex", z); err != nil {
		t.Fatal(err)
	}
	before := r.keyRows(t)
	k3 := masterKey(t, "k3", "three")
	for _, c := range []struct {
		name  string
		store *postgres.Store
		opts  postgres.RewrapOptions
		want  error
		msg   string
	}{
		{"wrong old key", r.open(t, r.k2, masterKey(t, "k1", "not one")), postgres.RewrapOptions{}, postgres.ErrMasterKeyChanged, "nothing was rewrapped"},
		// k1's keys come first: the check before the first batch stops it.
		{"one wrong old key of two", r.open(t, r.k2, r.k1, masterKey(t, "k0", "not zero")), postgres.RewrapOptions{BatchSize: 1}, postgres.ErrMasterKeyChanged, `"k0"`},
		{"one old key of two", r.open(t, r.k2, r.k1), postgres.RewrapOptions{BatchSize: 1}, postgres.ErrUnknownMasterKey, `master key k0 (1 keys)`},
		{"no old key", r.open(t, r.k2), postgres.RewrapOptions{}, postgres.ErrUnknownMasterKey, `master key k0 (1 keys), k1 (3 keys)`},
		{"another old key", r.open(t, r.k2, k3), postgres.RewrapOptions{}, postgres.ErrUnknownMasterKey, "nothing was rewrapped"},
		{"no master key", r.open(t, nil), postgres.RewrapOptions{}, postgres.ErrNoMasterKey, ""},
		{"batch too big", r.both, postgres.RewrapOptions{BatchSize: postgres.MaxRewrapBatch + 1}, nil, "out of range"},
		{"batch negative", r.both, postgres.RewrapOptions{BatchSize: -1}, nil, "out of range"},
	} {
		res, err := c.store.RewrapKeys(r.ctx, c.opts)
		if err == nil || (c.want != nil && !errors.Is(err, c.want)) || !contains(err.Error(), c.msg) || res.Rewrapped != 0 {
			t.Errorf("%s: %+v %v, want %v with %q", c.name, res, err, c.want, c.msg)
		}
		if !maps.Equal(before, r.keyRows(t)) {
			t.Fatalf("%s: key rows changed", c.name)
		}
	}
	for _, bad := range []struct {
		master *postgres.MasterKey
		old    []*postgres.MasterKey
	}{
		{r.k2, []*postgres.MasterKey{r.k2}},
		{r.k2, []*postgres.MasterKey{r.k1, r.k1}},
		{nil, []*postgres.MasterKey{r.k1}},
	} {
		_, err := postgres.New(r.ctx, r.store.Pool(), postgres.Config{Schema: r.store.Schema(), Registry: r.types.Registry,
			MasterKey: bad.master, OldMasterKeys: bad.old})
		if err == nil {
			t.Errorf("master %v old %v: accepted", bad.master, bad.old)
		}
	}
	for _, bad := range []string{"k1:AAAA", "k1:" + b64("one") + ",k1:" + b64("two"), "k 1:" + b64("one")} {
		if _, err := postgres.ParseMasterKeys(bad); err == nil {
			t.Errorf("ParseMasterKeys(%q) accepted", bad)
		}
	}
	keys, err := postgres.ParseMasterKeys(" k1:" + b64("one") + ", ,k0:" + b64("zero") + ",")
	if err != nil || len(keys) != 2 || keys[0].ID() != "k1" || keys[1].ID() != "k0" {
		t.Fatalf("ParseMasterKeys: %v %v", keys, err)
	}
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }

func b64(seed string) string { return base64.StdEncoding.EncodeToString(testevents.MasterKey(seed)) }
