package cli

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/saga"
	"github.com/projectorhq/projector/stores/postgres"
)

// sealedValue matches a sealed field's envelope in stored JSON:
// "pjx1.<base64url>".
var sealedValue = regexp.MustCompile(`"pjx1\.[A-Za-z0-9_=-]*"`)

// sealedMarker stands for a sealed field `saga show` cannot open.
const sealedMarker = `"(sealed)"`

// openSagaState opens the sealed personal fields of a shown instance's
// state in place, with the saga's declaration (from the binary's wiring)
// and the store's master key, and says what it did: "" when the state
// holds nothing sealed. A forgotten subject's fields read as null. When
// the fields cannot be opened (no master key, a saga this binary does not
// wire, a master key that does not open the subject's key) each one is
// shown as "(sealed)" and the note says why: the envelopes mean nothing
// to an operator, and nothing of the state is ever shown garbled.
func (a *App) openSagaState(ctx context.Context, store *postgres.Store, in *saga.InstanceDetail) (string, error) {
	if !projector.IsSealed(in.State) {
		return "", nil
	}
	mask := func(why string) (string, error) {
		in.State = sealedValue.ReplaceAll(in.State, []byte(sealedMarker))
		return "sealed, not shown: " + why, nil
	}
	p, err := a.sagaPersonal(store, in.Saga)
	if err != nil {
		return "", err
	}
	if p.Subject == "" {
		return mask(fmt.Sprintf("this binary does not wire saga %s with its personal declaration", projector.Printable(in.Saga)))
	}
	opened, forgotten, err := store.OpenData(ctx, store.Pool(), in.Tenant, p, in.State)
	switch {
	case errors.Is(err, postgres.ErrNoMasterKey):
		return mask("no master key (set " + postgres.MasterKeyEnv + " to show them)")
	case errors.Is(err, postgres.ErrMasterKeyChanged):
		_, why, _ := strings.Cut(err.Error(), postgres.ErrMasterKeyChanged.Error()+": ")
		return mask("master key changed: " + why)
	case err != nil:
		return "", err
	}
	in.State = opened
	subject, _ := p.SubjectOf(opened)
	if forgotten {
		return fmt.Sprintf("forgotten: subject %s was forgotten, its fields %s read as null", projector.Printable(subject), strings.Join(p.Fields, ", ")), nil
	}
	return fmt.Sprintf("opened: fields %s of subject %s", strings.Join(p.Fields, ", "), projector.Printable(subject)), nil
}

// sagaPersonal returns the personal declaration of the saga name among the
// binary's wired sagas: the zero value when it declares none or is not
// wired.
func (a *App) sagaPersonal(store *postgres.Store, name string) (projector.Personal, error) {
	w, err := a.wiring()
	if err != nil || w.Sagas == nil {
		return projector.Personal{}, err
	}
	sagas, err := w.Sagas(store)
	if err != nil {
		return projector.Personal{}, fmt.Errorf("wire sagas: %w", err)
	}
	for _, s := range sagas {
		if s.Name() == name {
			return s.Personal(), nil
		}
	}
	return projector.Personal{}, nil
}
