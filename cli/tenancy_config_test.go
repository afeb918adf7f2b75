package cli

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
)

// cli.Config's TenantRole and StrictTenancy reach the store every command
// opens: before, an application's `run` could not be given a tenant role,
// and logged a warning to set one it had no way to set. The suite connects
// as a superuser, so StrictTenancy without a role refuses, and a role that
// does not exist is named.
func TestConfigTenancyReachesTheStore(t *testing.T) {
	t.Parallel()
	store := pgtest.Store(t, projector.NewRegistry())
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{StrictTenancy: true}, "tenant scoping would not be enforced"},
		{Config{TenantRole: "projector_no_such_role_for_cli"}, `tenant role "projector_no_such_role_for_cli" does not exist`},
	} {
		var stderr bytes.Buffer
		code := Run(context.Background(), c.cfg, []string{"status", "--database-url", pgtest.URL(t), "--schema", store.Schema()}, &bytes.Buffer{}, &stderr)
		if code == ExitOK || !strings.Contains(stderr.String(), c.want) {
			t.Errorf("%+v: exit %d, want a failure naming %q:\n%s", c.cfg, code, c.want, stderr.String())
		}
	}
	if code := Run(context.Background(), Config{}, []string{"status", "--database-url", pgtest.URL(t), "--schema", store.Schema()}, &bytes.Buffer{}, &bytes.Buffer{}); code != ExitOK {
		t.Fatalf("status without tenancy settings: exit %d", code)
	}
}
