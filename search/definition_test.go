package search_test

import (
	"context"
	"errors"
	"testing"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/search"
)

func TestIndexValidate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		idx  search.Index
		ok   bool
	}{
		{"minimal", search.Index{Name: "tickets"}, true},
		{"full", search.Index{Name: "t_2", PrimaryKey: "key", Searchable: []string{"a"}, Filterable: []string{"b"}, Sortable: []string{"c"}}, true},
		{"empty name", search.Index{}, false},
		{"upper-case name", search.Index{Name: "Tickets"}, false},
		{"name too long", search.Index{Name: "a234567890123456789012345678901234567890x"}, false},
		{"attribute with a space", search.Index{Name: "t", Filterable: []string{"a b"}}, false},
		{"attribute twice", search.Index{Name: "t", Searchable: []string{"a", "a"}}, false},
		{"reserved attribute", search.Index{Name: "t", Filterable: []string{"projector_tenant"}}, false},
		{"reserved primary key", search.Index{Name: "t", PrimaryKey: "projector_key"}, false},
	} {
		err := tc.idx.Validate()
		if tc.ok != (err == nil) || (err != nil && !errors.Is(err, search.ErrInvalidIndex)) {
			t.Errorf("%s: Validate = %v, want ok=%v (else ErrInvalidIndex)", tc.name, err, tc.ok)
		}
	}
}

type nopBackend struct{ search.Backend }

// TestDefinitionErrorsStopTheStart: every definition mistake is returned
// by Async as projection.ErrInvalidDefinition, so a dispatcher never runs a
// half-defined search projection.
func TestDefinitionErrorsStopTheStart(t *testing.T) {
	t.Parallel()
	types := testevents.New()
	noop := func(context.Context, projector.Event, testevents.TicketOpened, *search.Writer) error { return nil }
	good := search.Config{Index: search.Index{Name: "tickets"}, Backend: nopBackend{}}
	for name, build := range map[string]func() *search.Projection{
		"nil backend": func() *search.Projection {
			p := search.New("s", search.Config{Index: search.Index{Name: "tickets"}})
			_ = search.On(p, types.Opened, noop)
			return p
		},
		"bad index": func() *search.Projection {
			p := search.New("s", search.Config{Index: search.Index{Name: "Bad"}, Backend: nopBackend{}})
			_ = search.On(p, types.Opened, noop)
			return p
		},
		"raw payloads": func() *search.Projection {
			p := search.New("s", search.Config{Index: search.Index{Name: "tickets"}, Backend: nopBackend{}, Async: projection.AsyncConfig{RawPayloads: true}})
			_ = search.On(p, types.Opened, noop)
			return p
		},
		"per-instance delivery": func() *search.Projection {
			p := search.New("s", search.Config{Index: search.Index{Name: "tickets"}, Backend: nopBackend{}, Async: projection.AsyncConfig{Delivery: projection.PerInstance}})
			_ = search.On(p, types.Opened, noop)
			return p
		},
		"no handlers": func() *search.Projection { return search.New("s", good) },
		"type handled twice": func() *search.Projection {
			p := search.New("s", good)
			_ = search.On(p, types.Opened, noop)
			_ = search.On(p, types.Opened, noop)
			return p
		},
		"undefined type": func() *search.Projection {
			p := search.New("s", good)
			_ = search.On(p, projector.EventType[testevents.TicketOpened]{}, noop)
			return p
		},
		"nil handler": func() *search.Projection {
			p := search.New("s", good)
			_ = search.On[testevents.TicketOpened](p, types.Opened, nil)
			return p
		},
	} {
		if _, err := build().Async(); !errors.Is(err, projection.ErrInvalidDefinition) {
			t.Errorf("%s: Async = %v, want ErrInvalidDefinition", name, err)
		}
	}
	p := search.New("s", good)
	if err := search.On(p, types.Opened, noop); err != nil {
		t.Fatal(err)
	}
	a, err := p.Async()
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Validate(types.Registry); err != nil {
		t.Fatalf("a good definition does not validate: %v", err)
	}
	if err := search.On(p, types.Closed, func(context.Context, projector.Event, testevents.TicketClosed, *search.Writer) error { return nil }); err == nil {
		t.Fatal("On after Async was accepted")
	}
}
