package projection_test

import (
	"errors"
	"testing"

	"github.com/projectorhq/projector/projection"
)

// OnForgotten refuses a table or column that is not a plain identifier
// (it is spliced into the statement, quoted) and a call without tables, as
// a definition error at registration.
func TestOnForgottenRefusesBadNames(t *testing.T) {
	t.Parallel()
	for _, f := range []projection.ForgetRows{
		{Table: "customers"},
		{Table: "", SubjectColumn: "customer"},
		{Table: "a.b.c", SubjectColumn: "customer"},
		{Table: "customers; DROP TABLE x", SubjectColumn: "customer"},
		{Table: "customers", SubjectColumn: "customer\"id"},
		{Table: "customers", SubjectColumn: "customer", TenantColumn: "tenant id"},
		{Table: "customers", SubjectColumn: "customer", Blank: []string{"name", ""}},
	} {
		a := projection.NewAsync("customers", projection.AsyncConfig{})
		if err := projection.OnForgotten(a, f); !errors.Is(err, projection.ErrInvalidDefinition) {
			t.Errorf("%+v: %v", f, err)
		}
	}
	if err := projection.OnForgotten(projection.NewAsync("customers", projection.AsyncConfig{})); !errors.Is(err, projection.ErrInvalidDefinition) {
		t.Errorf("no tables: %v", err)
	}
	ok := projection.NewAsync("customers", projection.AsyncConfig{})
	if err := projection.OnForgotten(ok, projection.ForgetRows{Table: "app.customers", SubjectColumn: "customer_id", TenantColumn: "tenant_id", Blank: []string{"name", "email"}}); err != nil {
		t.Fatal(err)
	}
}
