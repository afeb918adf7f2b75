package projectiontest

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/projectorhq/projector"
)

// eventLog is what became of a spec's events: applied, failed (and rolled
// back), or given and not applied yet. Failure messages list all three, so
// an event the kit never applied is never shown as applied.
type eventLog struct {
	// pending are the events given and not applied yet: the next check
	// applies them as one batch.
	pending []projector.Event
	// applied are the events applied, in order, the failed ones marked.
	applied []loggedEvent
}

type loggedEvent struct {
	projector.Event
	failed bool
}

// add gives events: they are pending until the next check.
func (l *eventLog) add(evs []projector.Event) { l.pending = append(l.pending, evs...) }

// settle records how far applying batch got: batch[:done] applied,
// batch[done:done+failed] failed, and the rest back in front of the
// pending events, for the next check.
func (l *eventLog) settle(batch []projector.Event, done, failed int) {
	for i, ev := range batch[:done+failed] {
		l.applied = append(l.applied, loggedEvent{Event: ev, failed: i >= done})
	}
	l.pending = append(slices.Clip(batch[done+failed:]), l.pending...)
}

// checkApplied fails t if the spec ended with events given and never
// applied: a spec whose last events no check applies would pass whatever
// its handler does with them. A test that failed already is not told.
func (l *eventLog) checkApplied(t testing.TB, checks string) {
	if len(l.pending) == 0 || t.Failed() {
		return
	}
	t.Errorf("projectiontest: the spec ended with %d event(s) given and never applied: events are applied by the next check (%s) or When, so end the spec with a check\n%s",
		len(l.pending), checks, l.describe())
}

// describe lists the events applied and those given but not applied, one
// a line, for failure messages.
func (l *eventLog) describe() string {
	var b strings.Builder
	fmt.Fprintf(&b, "events (%d):", len(l.applied))
	for i, e := range l.applied {
		writeEvent(&b, i+1, e.Event)
		if e.failed {
			b.WriteString(" (failed, rolled back)")
		}
	}
	if len(l.pending) > 0 {
		fmt.Fprintf(&b, "\ngiven, not applied (%d):", len(l.pending))
		for i, ev := range l.pending {
			writeEvent(&b, len(l.applied)+i+1, ev)
		}
	}
	return b.String()
}

func writeEvent(b *strings.Builder, n int, ev projector.Event) {
	fmt.Fprintf(b, "\n  %d. %s v%d of %s at %s %s", n, ev.Type, ev.Version, ev.Stream,
		ev.RecordedAt.UTC().Format(time.RFC3339Nano), printable(ev.Data))
}
