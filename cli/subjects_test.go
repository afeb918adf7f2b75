package cli

import (
	"context"
	"encoding/base64"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/stores/postgres"
)

// `subjects forget` forgets once (exit 0), refuses a second forget (exit
// 3), does not find an unknown subject (exit 1, pointing at --tenant) and
// says what forgets the read models' copies; it takes an unstorable id
// as a bad command line (exit 2); it needs no master key.
func TestSubjectsForget(t *testing.T) {
	t.Parallel()
	types, store := customerAda(t)
	for _, c := range []struct {
		args []string
		code int
		out  string
	}{
		{[]string{"subjects", "forget", "c-1", "--tenant", "acme"}, ExitOK, "read models that copied them forget them when their consumers reach that event, if they handle subject.forgotten"},
		{[]string{"subjects", "forget", "c-1", "--tenant", "acme"}, ExitRefused, "already forgotten"},
		{[]string{"subjects", "forget", "c-1"}, ExitError, "no personal data (no key): not found; check the id, and the tenant: a subject is its tenant's (--tenant, here __system__)"},
		{[]string{"subjects", "forget", "c\x00-1", "--tenant", "acme"}, ExitUsage, "NUL"},
		{[]string{"subjects", "forget"}, ExitUsage, "missing ID"},
	} {
		out, code := runIn(t, store.Schema(), types.Registry, c.args...)
		if code != c.code || !strings.Contains(out, c.out) {
			t.Errorf("%q: exit %d, want %d with %q:\n%s", c.args, code, c.code, c.out, out)
		}
	}
	evs, err := store.ReadStream(context.Background(), projector.TenantStream("acme", "customer", "c-1"), postgres.StreamQuery{})
	if err != nil || !evs[0].Forgotten {
		t.Fatalf("after forget: %+v %v", evs, err)
	}
}

// `subjects forget` from a binary whose registry defines no personal event
// type (the stock projector on an application's schema) says to run it from
// the application's binary, and writes nothing. It said only "the registry
// defines no event type with personal fields", which left an operator
// holding the stock binary, as the docs show it, without the next step.
func TestSubjectsForgetFromABinaryWithoutTheTypes(t *testing.T) {
	t.Parallel()
	_, store := customerAda(t)
	out, code := runIn(t, store.Schema(), projector.NewRegistry(), "subjects", "forget", "c-1", "--tenant", "acme")
	// The reason comes first: "forget subject acme/c-1: unknown event type: ..."
	// read as if c-1 named a type.
	if code != ExitError || !strings.Contains(out, "application's binary") || !strings.Contains(out, "cli.Config.Registry") ||
		!strings.Contains(out, "forget subject acme/c-1: this binary's registry defines no event type with personal fields") {
		t.Errorf("exit %d, want %d with a pointer to the application's binary:\n%s", code, ExitError, out)
	}
	evs, err := store.ReadStream(context.Background(), projector.TenantStream("acme", "customer", "c-1"), postgres.StreamQuery{})
	if err != nil || evs[0].Forgotten {
		t.Fatalf("forgotten by a refused forget: %+v %v", evs, err)
	}
}

// `subjects rewrap` rotates the master key: bad keys fail (exit 1) and
// change nothing, a malformed key, no master key or a bad batch size are a
// bad command line (exit 2), the rewrap moves every key to the new master
// key, and a second one has nothing to do. Not parallel: it sets the
// environment.
func TestSubjectsRewrap(t *testing.T) {
	ctx := context.Background()
	types := testevents.NewPersonal()
	k1, err := postgres.NewMasterKey("k1", testevents.MasterKey("one"))
	if err != nil {
		t.Fatal(err)
	}
	store := pgtest.Store(t, types.Registry, postgres.Config{MasterKey: k1})
	for _, id := range []string{"c-1", "c-2", "c-3"} {
		err = pgx.BeginFunc(ctx, store.Pool(), func(tx pgx.Tx) error {
			_, err := store.Append(ctx, tx, projector.TenantStream("acme", "customer", id), projector.NoStream,
				testevents.CustomerRegistered{Customer: id, Name: "Name of " + id, Email: id + "@example.com"})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	key := func(id, seed string) string {
		return id + ":" + base64.StdEncoding.EncodeToString(testevents.MasterKey(seed))
	}
	keysBy := func() string {
		var s string
		err := store.Pool().QueryRow(ctx, `SELECT string_agg(master_key_id, ',' ORDER BY subject) FROM `+store.Table("projector_subject_keys")).Scan(&s)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	for _, c := range []struct {
		master, old string
		args        []string
		code        int
		out         string
		keys        string
	}{
		{key("k2", "two"), "", nil, ExitError, "master key k1 (3 keys), which is neither", "k1,k1,k1"},
		{key("k2", "two"), key("k1", "not one"), nil, ExitError, "master key changed", "k1,k1,k1"},
		{key("k2", "two"), "k1:AAAA", nil, ExitUsage, "PROJECTOR_OLD_MASTER_KEYS: item 1", "k1,k1,k1"},
		{"k2", "", nil, ExitUsage, "PROJECTOR_MASTER_KEY: master key: want ID:BASE64KEY", "k1,k1,k1"},
		{"", key("k1", "one"), nil, ExitUsage, "PROJECTOR_MASTER_KEY is not", "k1,k1,k1"},
		{"", "", nil, ExitUsage, "no master key", "k1,k1,k1"},
		{key("k2", "two"), key("k2", "two"), nil, ExitUsage, "an old key needs an id of its own", "k1,k1,k1"},
		{key("k2", "two"), key("k1", "one"), []string{"--batch-size", "0"}, ExitUsage, "--batch-size 0", "k1,k1,k1"},
		{key("k2", "two"), key("k1", "one"), []string{"--batch-size", "10001"}, ExitUsage, "want 1 to 10000", "k1,k1,k1"},
		{key("k2", "two"), key("k1", "one"), []string{"--batch-size", "2"}, ExitOK, "rewrapped 3 data keys under master key k2 in 2 batches (from k1: 3)", "k2,k2,k2"},
		{key("k2", "two"), key("k1", "one"), nil, ExitOK, "nothing to rewrap: every data key is wrapped by master key k2", "k2,k2,k2"},
		{key("k2", "two"), "", nil, ExitOK, "nothing to rewrap", "k2,k2,k2"},
	} {
		t.Setenv(postgres.MasterKeyEnv, c.master)
		t.Setenv(postgres.OldMasterKeysEnv, c.old)
		out, code := runIn(t, store.Schema(), types.Registry, append([]string{"subjects", "rewrap"}, c.args...)...)
		if code != c.code || !strings.Contains(out, c.out) {
			t.Errorf("master %.2s old %.2s %q: exit %d, want %d with %q:\n%s", c.master, c.old, c.args, code, c.code, c.out, out)
		}
		if strings.Contains(out, base64.StdEncoding.EncodeToString(testevents.MasterKey("one"))[:8]) {
			t.Errorf("the output holds key material:\n%s", out)
		}
		if got := keysBy(); got != c.keys {
			t.Fatalf("after %q: keys wrapped by %s, want %s", c.args, got, c.keys)
		}
	}
	k2, err := postgres.NewMasterKey("k2", testevents.MasterKey("two"))
	if err != nil {
		t.Fatal(err)
	}
	s2, err := postgres.New(ctx, store.Pool(), postgres.Config{Schema: store.Schema(), Registry: types.Registry, MasterKey: k2})
	if err != nil {
		t.Fatal(err)
	}
	evs, err := s2.ReadStream(ctx, projector.TenantStream("acme", "customer", "c-2"), postgres.StreamQuery{})
	if err != nil || len(evs) != 1 || evs[0].Payload.(testevents.CustomerRegistered).Name != "Name of c-2" {
		t.Fatalf("read with k2 alone: %+v %v", evs, err)
	}
}

// customerAda is a store of personal types with customer c-1 of tenant
// acme registered.
func customerAda(t *testing.T) (testevents.PersonalTypes, *postgres.Store) {
	t.Helper()
	ctx := context.Background()
	types := testevents.NewPersonal()
	master, err := postgres.NewMasterKey("cli", testevents.MasterKey("cli"))
	if err != nil {
		t.Fatal(err)
	}
	store := pgtest.Store(t, types.Registry, postgres.Config{MasterKey: master})
	err = pgx.BeginFunc(ctx, store.Pool(), func(tx pgx.Tx) error {
		_, err := store.Append(ctx, tx, projector.TenantStream("acme", "customer", "c-1"), projector.NoStream,
			testevents.CustomerRegistered{Customer: "c-1", Name: "Ada", Email: "ada@example.com"})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return types, store
}

// A failure names the binary once: sentinels of ours read "projector: ..."
// and, wrapped mid-message, printed "projector: forget subject acme/c-1:
// projector: unknown event type" (and "...: projector: not found"), the
// binary's name again in the middle of the line; `events prune` and
// `events import` did the same.
func TestErrorsNameTheBinaryOnce(t *testing.T) {
	t.Parallel()
	types, store := customerAda(t)
	for _, c := range []struct {
		reg  *projector.Registry
		args []string
		code int
		want string
	}{
		{types.Registry, []string{"subjects", "forget", "c-1"}, ExitError, "not found; check the id"},
		{types.Registry, []string{"subjects", "forget", "c\x00-1", "--tenant", "acme"}, ExitUsage, "invalid payload"},
		{projector.NewRegistry(), []string{"subjects", "forget", "c-1", "--tenant", "acme"}, ExitError, "unknown event type"},
		{types.Registry, []string{"events", "prune", "--older-than", "1h", "--stream-type", "customer"}, ExitUsage, "prune would delete aggregate history"},
		{types.Registry, []string{"events", "import", "/dev/null"}, ExitError, "invalid history file: empty file"},
	} {
		var out, errOut strings.Builder
		args := append([]string{"--database-url", pgtest.URL(t), "--schema", store.Schema()}, c.args...)
		code := Run(t.Context(), Config{Registry: c.reg, Getenv: func(string) string { return "" }}, args, &out, &errOut)
		got := errOut.String()
		if code != c.code || !strings.Contains(got, c.want) || strings.Count(got, "projector:") != 1 || !strings.HasPrefix(got, "projector: ") {
			t.Errorf("%q: exit %d, want %d, and stderr naming the binary once, first, with %q:\n%s", c.args, code, c.code, c.want, got)
		}
	}
}
