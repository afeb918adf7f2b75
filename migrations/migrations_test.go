package migrations_test

import (
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/projectorhq/projector/migrations"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestAllMigrationsAreWellFormed(t *testing.T) {
	all, err := migrations.All()
	if err != nil {
		t.Fatal(err)
	}
	if len(all) == 0 {
		t.Fatal("no migrations embedded")
	}
	for _, m := range all {
		if !strings.Contains(m.SQL, migrations.SchemaPlaceholder) {
			t.Errorf("migration %04d_%s never names its schema; tables would land in the search path", m.Version, m.Name)
		}
		if strings.Contains(m.SQL, "projector.projector_") {
			t.Errorf("migration %04d_%s hard-codes the default schema", m.Version, m.Name)
		}
	}
}
