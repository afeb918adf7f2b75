package projection

import (
	"context"
	"fmt"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/stores/postgres"
)

// refusedUpcast returns the error of an event that a raw read could not
// bring to its type's current schema version, or nil.
//
// The dispatcher reads raw and decodes only for typed handlers, so without
// this check a RawPayloads consumer would be handed the stored, older JSON of
// an event its upcaster refused, while a typed consumer of the same event
// halts or dead-letters it. A raw read leaves such an event at its stored
// schema version; every handler form checks for that here and fails the
// event with the upcaster's own error, so the consumer's error mode decides
// what happens to it, the same for every handler form. Decoded events
// (a payload is set) and handlers run outside a dispatcher (no store in ctx)
// skip the check.
func refusedUpcast(ctx context.Context, ev *projector.Event) error {
	if ev.Payload != nil {
		return nil
	}
	s, ok := ctx.Value(storeKey{}).(*postgres.Store)
	if !ok {
		return nil
	}
	reg := s.Registry()
	info, ok := reg.Lookup(ev.Type)
	if !ok || ev.SchemaVersion == info.SchemaVersion {
		return nil
	}
	if _, _, err := reg.Upcast(ev.Type, ev.SchemaVersion, ev.Data); err != nil {
		return fmt.Errorf("event %s: %w", ev.ID, err)
	}
	// The upcaster succeeded this time: still refuse the stale JSON rather
	// than hand the handler a shape it was not written for.
	return fmt.Errorf("%w: event %s: %s is at schema version %d, not %d", projector.ErrInvalidPayload, ev.ID, ev.Type, ev.SchemaVersion, info.SchemaVersion)
}

// refusedUpcastIn is [refusedUpcast] over every event of a batch.
func refusedUpcastIn(ctx context.Context, b Batch) error {
	for _, s := range b.Streams {
		for i := range s.Events {
			if err := refusedUpcast(ctx, &s.Events[i]); err != nil {
				return err
			}
		}
	}
	return nil
}
