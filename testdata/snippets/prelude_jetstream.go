package snippets

import (
	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/projectorhq/projector/stores/jetstream"
)

// A message fetched from JetStream.
var msg natsjs.Msg

// The claims consumer of the page and its stream.
var consumer *jetstream.Consumer

var streamInfo *natsjs.StreamInfo

// The consumer's handler.
var applyBilling jetstream.ConsumerHandler
