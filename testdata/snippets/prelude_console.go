package snippets

import (
	"github.com/projectorhq/projector/live"
	"github.com/projectorhq/projector/projection"
)

// The application's async projections and its live feed.
var async []*projection.Async

var feed *live.Feed
