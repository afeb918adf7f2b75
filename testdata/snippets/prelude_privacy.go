package snippets

import (
	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/projection"
)

// The page's customers read model and its event type's handle.
var customers *projection.Async

var customerRegistered projector.EventType[CustomerRegistered]
