package console

import (
	"fmt"
	"net/http"

	"github.com/projectorhq/projector"
)

// TailTenantParam is the query parameter the live tail panel sends the
// tenant the operator typed in.
const TailTenantParam = "tenant"

// TailTenant is an authoriser for the live feed behind the console's live
// tail (live.Config.Authorize): the tenant the operator typed into the
// panel, the system tenant by default. It lets whoever can load the console
// watch any tenant's event envelopes — the same reach the read-only console
// gives over consumers and dead letters — never their payloads, as long
// as the feed is configured without them (live.Config.Payloads false, as
// `projector run` does). An application that must narrow this writes its
// own authoriser.
func TailTenant(r *http.Request) (string, error) {
	t := r.URL.Query().Get(TailTenantParam)
	if t == "" {
		return projector.SystemTenant, nil
	}
	if err := checkTenant(t); err != nil {
		return "", err
	}
	return t, nil
}

// checkTenant validates a tenant an operator typed (the live tail's box,
// the saga list's filter) as a stream's tenant is validated, before it goes
// anywhere near PostgreSQL.
func checkTenant(t string) error {
	if err := projector.TenantStream(t, "-", "-").Validate(); err != nil {
		return fmt.Errorf("%w: tenant: %w", ErrInvalidInput, err)
	}
	return nil
}
