package cli

import (
	"context"
	"fmt"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/saga"
	"github.com/projectorhq/projector/stores/postgres"
)

// openSagaState opens the sealed personal fields of a shown instance's
// state in place with the wired saga's declaration (saga.OpenState), and
// says what it did: "" when the state holds nothing sealed.
func (a *App) openSagaState(ctx context.Context, store *postgres.Store, in *saga.InstanceDetail) (string, error) {
	if !projector.IsSealed(in.State) {
		return "", nil
	}
	p, err := a.sagaPersonal(store, in.Saga)
	if err != nil {
		return "", err
	}
	return saga.OpenState(ctx, store, in, p,
		fmt.Sprintf("this binary does not wire saga %s with its personal declaration", projector.Printable(in.Saga)))
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
