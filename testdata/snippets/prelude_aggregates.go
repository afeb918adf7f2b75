package snippets

import (
	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/aggregate"
)

// What the page's first block sets up, for the blocks after it.
var carts *aggregate.Repository[Cart]

var itemAdded projector.EventType[ItemAdded]

var ref projector.StreamRef
