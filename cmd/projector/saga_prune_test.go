package main_test

import (
	"context"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

// `events prune` also prunes completed saga instances past
// --saga-retention (default 30d; 0 keeps them): a dry run counts and
// deletes nothing, a real run deletes only completed instances older than
// the retention, never active or failed ones, however old; a bad retention
// is exit 2 with nothing deleted. `status` names the saga with a failed
// instance.
func TestEventsPruneSagaRetention(t *testing.T) {
	t.Parallel()
	o := newOpsEnv(t)
	ctx := context.Background()
	instances := o.store.Table("projector_saga_instances")
	_, err := o.store.Pool().Exec(ctx, `INSERT INTO `+instances+` (id, saga, tenant_id, key, correlation_id, state, status, completed_at)
		VALUES (gen_random_uuid(), 'sla', '', 'done-40d', gen_random_uuid(), '{}', 'completed', now() - interval '40 days'),
		       (gen_random_uuid(), 'sla', '', 'done-1d', gen_random_uuid(), '{}', 'completed', now() - interval '1 day'),
		       (gen_random_uuid(), 'sla', '', 'done-now', gen_random_uuid(), '{}', 'completed', now()),
		       (gen_random_uuid(), 'sla', '', 'active-old', gen_random_uuid(), '{}', 'active', NULL),
		       (gen_random_uuid(), 'sla', '', 'failed-old', gen_random_uuid(), '{}', 'failed', NULL)`)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := o.store.Pool().Exec(ctx, `UPDATE `+instances+` SET created_at = now() - interval '90 days', updated_at = now() - interval '90 days'
		WHERE key LIKE '%-old'`); err != nil {
		t.Fatal(err)
	}
	keys := func() []string {
		t.Helper()
		rows, err := o.store.Pool().Query(ctx, `SELECT key FROM `+instances+` ORDER BY key`)
		if err != nil {
			t.Fatal(err)
		}
		k, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	all := []string{"active-old", "done-1d", "done-40d", "done-now", "failed-old"}

	// A failed instance shows in `status` and in `saga list --status failed`.
	r := run(t, o.env, "status")
	if r.code != 0 || !regexp.MustCompile(`(?m)^SAGAS WITH FAILED INSTANCES\n.*\nsla +1 +projector saga list sla --status failed$`).MatchString(r.stdout) {
		t.Fatalf("status does not show the failed saga instance: %+v", r)
	}
	r = run(t, o.env, "saga", "list", "sla", "--status", "failed")
	if r.code != 0 || !strings.Contains(r.stdout, "failed-old") || strings.Contains(r.stdout, "done-") {
		t.Fatalf("saga list --status failed: %+v", r)
	}

	for _, bad := range []string{"-1h", "0s", "soon", "99999999d", "1"} {
		wantError(t, run(t, o.env, "events", "prune", "--older-than", "1h", "--saga-retention", bad), 2, "--saga-retention")
	}
	if got := keys(); !slices.Equal(got, all) {
		t.Fatalf("a refused prune deleted instances: %v", got)
	}

	r = run(t, o.env, "events", "prune", "--older-than", "1h", "--dry-run")
	if r.code != 0 || !strings.Contains(r.stdout, "would delete 1 saga instance completed more than 30d ago") {
		t.Fatalf("dry run with the default retention: %+v", r)
	}
	if got := keys(); !slices.Equal(got, all) {
		t.Fatalf("a dry run deleted instances: %v", got)
	}
	r = run(t, o.env, "events", "prune", "--older-than", "1h", "--saga-retention", "0")
	if r.code != 0 || strings.Contains(r.stdout, "saga") {
		t.Fatalf("--saga-retention 0: %+v", r)
	}
	if got := keys(); !slices.Equal(got, all) {
		t.Fatalf("--saga-retention 0 deleted instances: %v", got)
	}
	r = run(t, o.env, "events", "prune", "--older-than", "1h")
	if r.code != 0 || !strings.Contains(r.stdout, "deleted 1 saga instance completed more than 30d ago") {
		t.Fatalf("prune with the default retention: %+v", r)
	}
	if got := keys(); !slices.Equal(got, []string{"active-old", "done-1d", "done-now", "failed-old"}) {
		t.Fatalf("after the default retention: %v", got)
	}
	r = run(t, o.env, "events", "prune", "--older-than", "1h", "--saga-retention", "12h")
	if r.code != 0 || !strings.Contains(r.stdout, "deleted 1 saga instance completed more than 12h ago") {
		t.Fatalf("prune with 12h: %+v", r)
	}
	if got := keys(); !slices.Equal(got, []string{"active-old", "done-now", "failed-old"}) {
		t.Fatalf("after 12h: %v, want active and failed kept however old", got)
	}
}
