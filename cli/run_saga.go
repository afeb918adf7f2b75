package cli

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/saga"
	"github.com/projectorhq/projector/stores/postgres"
)

// sagaConsumers builds the application's sagas (Wiring.Sagas) on store and
// returns the consumers `run` dispatches, the application's async
// projections followed by each saga's, and the runner that fires their
// timeouts, its metrics on reg beside the dispatcher's. Without sagas the
// runner is a no-op, so `run` starts and stops it either way.
func (a *App) sagaConsumers(store *postgres.Store, w Wiring, log *slog.Logger, reg prometheus.Registerer) ([]*projection.Async, *sagaRunner, error) {
	async := append([]*projection.Async(nil), w.Async...)
	if w.Sagas == nil {
		return async, &sagaRunner{}, nil
	}
	defs, err := w.Sagas(store)
	if err != nil {
		return nil, nil, fmt.Errorf("wire sagas: %w", err)
	}
	if len(defs) == 0 {
		return async, &sagaRunner{}, nil // run refuses a binary with nothing at all to run
	}
	for _, s := range defs {
		if s == nil {
			return nil, nil, fmt.Errorf("wire sagas: a nil saga")
		}
		p, err := s.Projection(store)
		if err != nil {
			return nil, nil, fmt.Errorf("wire sagas: %w", err)
		}
		async = append(async, p)
	}
	r, err := saga.NewRunner(saga.RunnerConfig{Store: store, Sagas: defs, Logger: log, Registerer: reg})
	if err != nil {
		return nil, nil, fmt.Errorf("wire sagas: %w", err)
	}
	names := make([]string, len(defs))
	var personal map[string]projector.Personal
	for i, s := range defs {
		names[i] = s.Name()
		if p := s.Personal(); p.Subject != "" {
			if personal == nil {
				personal = map[string]projector.Personal{}
			}
			personal[s.Name()] = p
		}
	}
	return async, &sagaRunner{r: r, names: names, personal: personal}, nil
}

// sagaRunner is the saga runner `run` starts beside the dispatcher, or
// nothing when the binary has no sagas.
type sagaRunner struct {
	r *saga.Runner
	// names are the sagas' names, whose instances the console lists;
	// personal their personal declarations, with which it opens a state.
	names    []string
	personal map[string]projector.Personal
}

func (s *sagaRunner) Start(ctx context.Context) error {
	if s.r == nil {
		return nil
	}
	return s.r.Start(ctx)
}

// Stop stops the runner first: a timeout step in flight rolls back and
// fires later, and nothing new is claimed while the dispatcher drains.
func (s *sagaRunner) Stop(ctx context.Context) error {
	if s.r == nil {
		return nil
	}
	return s.r.Stop(ctx)
}
