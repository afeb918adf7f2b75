package snippets

import (
	"net/http"

	"github.com/projectorhq/projector/projection"
)

// A stream id from the request.
var id string

// The event the escalation example appends.
type EscalationStarted struct{}

// Every async projection of the application.
var projections []*projection.Async

// The application's own session store.
var sessions interface {
	FromRequest(r *http.Request) (struct{ TenantID string }, error)
}
