package projection

import (
	"context"
	"fmt"
	"regexp"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/stores/postgres"
)

// Inline is a projection applied inside the transaction of every append
// (pass it to postgres.Config.Inline): its read-model writes commit together
// with the events and the caller's own writes, or not at all. A handler error
// fails the append and aborts the transaction.
//
// Inline handlers run in the caller's transaction as the caller scoped it:
// Projector does not switch tenants there.
type Inline struct {
	name    string
	version int
	tables  []string
	t       table
}

// The store records an Inline in the database; see [Inline.SetVersion].
var _ postgres.RecordedInline = (*Inline)(nil)

// NewInline returns an empty inline projection; register handlers with
// [On], [OnEvent] or [OnBatch].
func NewInline(name string) *Inline {
	p := &Inline{name: name, version: 1}
	if err := validName(name); err != nil {
		p.t.fail(name, err)
	}
	return p
}

// Name returns the projection's name.
func (p *Inline) Name() string { return p.name }

func (p *Inline) handlers() *table { return &p.t }

// Version returns the projection's definition version: 1 unless
// [Inline.SetVersion] raised it. The store records it in the database with
// the handled event types (it implements postgres.RecordedInline).
func (p *Inline) Version() int { return p.version }

// SetVersion sets the projection's definition version (at least 1; 1 by
// default). Raise it when a change to the handlers must stop binaries with
// the older definition from appending the event types it handles: once a
// store with the new version has started on a schema, the newest version
// recorded there wins, and a store with an older one is refused those
// appends with postgres.ErrInlineProjectionRequired. That is the fence for a
// rolling deploy; see docs/projections.md. A version below 1 is an
// [ErrInvalidDefinition], returned here and again when the store starts.
func (p *Inline) SetVersion(v int) error {
	if v < 1 {
		return p.t.fail(p.name, fmt.Errorf("version %d: want 1 or more", v))
	}
	p.version = v
	return nil
}

// SetTables declares the read-model tables the projection's handlers write,
// as they name them ("table", resolved on the search_path, or
// "schema.table"). A rebuild needs them: `projector rebuild NAME` of an
// inline projection is carried out by a process that has its code
// (`projector run`, or `rebuild NAME --here`), which copies, rebuilds and
// switches exactly these tables (rebuild.InlineOptions.Tables overrides
// them). An empty name is an [ErrInvalidDefinition].
func (p *Inline) SetTables(tables ...string) error {
	for _, t := range tables {
		if t == "" {
			return p.t.fail(p.name, fmt.Errorf("an empty table name among %q", tables))
		}
	}
	p.tables = append([]string(nil), tables...)
	return nil
}

// Tables returns the tables [Inline.SetTables] declared (a copy).
func (p *Inline) Tables() []string { return append([]string(nil), p.tables...) }

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
