package snippets

import "github.com/projectorhq/projector/projection"

// Every async projection of the application.
var projections []*projection.Async
