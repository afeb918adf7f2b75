package search

import (
	"context"

	"github.com/projectorhq/projector"
)

// OnForgotten makes p forget data subjects: on each
// [projector.SubjectForgotten] event it deletes the documents of the
// event's tenant whose attribute attr equals the subject's id, on
// PostgreSQL and Meilisearch alike. attr must be declared in
// [Index.Filterable]. It is the one line a search projection over personal
// data needs for promise 19 (docs/privacy.md); a projection that should
// keep a document and blank its personal attributes instead handles the
// event itself with [On] and [Writer.Patch].
func OnForgotten(p *Projection, attr string) error {
	if err := p.cfg.Index.checkFilters([]Filter{Eq(attr, "")}); err != nil {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.fail(err)
	}
	return On(p, projector.SubjectForgottenType, func(_ context.Context, _ projector.Event, f projector.SubjectForgotten, w *Writer) error {
		return w.DeleteWhere(Eq(attr, f.Subject))
	})
}
