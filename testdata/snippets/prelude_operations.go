package snippets

import "github.com/projectorhq/projector/projection"

// The async projections of projections.md.
var history *projection.Async
