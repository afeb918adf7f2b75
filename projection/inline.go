package projection

import (
	"context"
	"fmt"
	"regexp"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
)

// Inline is a projection applied inside the transaction of every append
// (pass it to postgres.Config.Inline): its read-model writes commit together
// with the events and the caller's own writes, or not at all. A handler error
// fails the append and aborts the transaction.
//
// Inline handlers run in the caller's transaction as the caller scoped it:
// Projector does not switch tenants there.
type Inline struct {
	name string
	t    table
}

// NewInline returns an empty inline projection; register handlers with
// [On], [OnEvent] or [OnBatch].
func NewInline(name string) *Inline {
	p := &Inline{name: name}
	if err := validName(name); err != nil {
		p.t.fail(name, err)
	}
	return p
}

// Name returns the projection's name.
func (p *Inline) Name() string { return p.name }

func (p *Inline) handlers() *table { return &p.t }

// EventTypes returns the handled event types in registration order.
func (p *Inline) EventTypes() []string { return p.t.eventTypes() }

// Validate reports a registration error, or a handled type reg does not
// define. The store calls it when it is built, so a bad projection stops the
// start rather than the first append.
func (p *Inline) Validate(reg *projector.Registry) error { return p.t.validate(p.name, reg) }

// ApplyInline runs the handlers for the events one append wrote. It
// implements postgres.InlineProjection.
func (p *Inline) ApplyInline(ctx context.Context, tx pgx.Tx, events []projector.Event) error {
	if p.t.batch != nil {
		var mine []projector.Event
		for _, ev := range events {
			if p.t.handles(ev.Type) {
				mine = append(mine, ev)
			}
		}
		for _, b := range groupBatch(mine) {
			if err := p.t.batch(ctx, tx, b); err != nil {
				return err
			}
		}
		return nil
	}
	for _, ev := range events {
		h := p.t.byType[ev.Type]
		if h == nil {
			continue
		}
		if err := h(ctx, tx, ev); err != nil {
			return fmt.Errorf("%s v%d of %s: %w", ev.Type, ev.Version, ev.Stream, err)
		}
	}
	return nil
}

func (t *table) handles(typ string) bool {
	if t.byType[typ] != nil {
		return true
	}
	if t.batch != nil {
		for _, x := range t.types {
			if x == typ {
				return true
			}
		}
	}
	return false
}

var namePattern = regexp.MustCompile(`^[a-z][a-z0-9_.-]{0,99}$`)

// validName keeps projection names safe to print, to pass on a command line
// and to use as metric labels.
func validName(name string) error {
	if !namePattern.MatchString(name) {
		return fmt.Errorf("name %q: want lower case letters, digits, '_', '.', '-', starting with a letter, at most 100", name)
	}
	return nil
}
