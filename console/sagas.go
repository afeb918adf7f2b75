package console

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/google/uuid"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/saga"
)

// sagas lists every saga the console knows (Config.Sagas, and any with
// instances) with its instances by status and its pending and overdue
// timeouts: saga.Summaries, one read of the status and due indexes.
func (c *Console) sagas(w http.ResponseWriter, r *http.Request) {
	sums, err := saga.Summaries(r.Context(), c.cfg.Store)
	if err != nil {
		c.log.Error("console: summarise sagas", slog.Any("error", err))
		c.reply(w, r, http.StatusInternalServerError, err.Error())
		return
	}
	for _, n := range c.cfg.Sagas {
		if !slices.ContainsFunc(sums, func(s saga.Summary) bool { return s.Saga == n }) {
			sums = append(sums, saga.Summary{Saga: n})
		}
	}
	slices.SortFunc(sums, func(a, b saga.Summary) int { return strings.Compare(a.Saga, b.Saga) })
	d := c.page(r, "Sagas", nil)
	d.SagaSummaries = sums
	c.render(w, r, http.StatusOK, "sagas.html", d)
}

// sagaInstances lists one saga's instances, most recently updated first,
// as `projector saga list` does: ?status=active|completed|failed|parked|all,
// ?tenant=T, ?limit=N (1 to MaxListLimit, default Config.SagaLimit). A
// saga neither configured nor with any instance is 404.
func (c *Console) sagaInstances(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if err := checkName("saga", name); err != nil {
		c.reply(w, r, http.StatusBadRequest, err.Error())
		return
	}
	q := r.URL.Query()
	lq := saga.ListQuery{Saga: name, Limit: c.cfg.SagaLimit}
	filter := q.Get("status")
	switch filter {
	case "", "all":
		filter = "all"
	default:
		st, err := saga.ParseStatus(filter)
		if err != nil {
			c.reply(w, r, http.StatusBadRequest, fmt.Sprintf("%v: status %q: want active, completed, failed, parked or all", ErrInvalidInput, filter))
			return
		}
		lq.Statuses = []saga.Status{st}
	}
	if t := q.Get("tenant"); t != "" {
		if err := checkTenant(t); err != nil {
			c.reply(w, r, http.StatusBadRequest, err.Error())
			return
		}
		lq.Tenant = t
	}
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > MaxListLimit {
			c.reply(w, r, http.StatusBadRequest, fmt.Sprintf("%v: limit %q: want a number from 1 to %d", ErrInvalidInput, l, MaxListLimit))
			return
		}
		lq.Limit = n
	}
	sums, err := saga.Summaries(r.Context(), c.cfg.Store, name)
	if err != nil {
		c.log.Error("console: summarise saga", slog.String("saga", name), slog.Any("error", err))
		c.reply(w, r, http.StatusInternalServerError, err.Error())
		return
	}
	sum := saga.Summary{Saga: name}
	switch {
	case len(sums) == 1:
		sum = sums[0]
	case !slices.Contains(c.cfg.Sagas, name):
		c.reply(w, r, http.StatusNotFound, fmt.Sprintf("no saga %q: it has no instances and is not one the console was configured with: %v", name, projector.ErrNotFound))
		return
	}
	list, err := saga.List(r.Context(), c.cfg.Store, lq)
	if err != nil {
		c.log.Error("console: list saga instances", slog.String("saga", name), slog.Any("error", err))
		c.reply(w, r, http.StatusInternalServerError, err.Error())
		return
	}
	for i := range list {
		list[i].State = nil // a saga's state may carry personal data: only the single view shows it, when enabled
	}
	d := c.page(r, "Saga "+name, nil)
	d.SagaName, d.SagaSummary, d.SagaInstances = name, &sum, list
	d.Filter, d.Tenant, d.Limit = filter, lq.Tenant, lq.Limit
	c.render(w, r, http.StatusOK, "saga.html", d)
}

// sagaInstance is the single instance view, what `projector saga show`
// prints: the instance, its pending timeouts, the steps that drove it and
// the events it appended; its state only when Config.ShowPayloads, as a
// dead letter's payload.
func (c *Console) sagaInstance(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if err := checkName("saga", name); err != nil {
		c.reply(w, r, http.StatusBadRequest, err.Error())
		return
	}
	id, err := uuid.Parse(r.PathValue("id"))
	if err != nil {
		c.reply(w, r, http.StatusBadRequest, fmt.Sprintf("%v: saga instance id %q: want a UUID", ErrInvalidInput, r.PathValue("id")))
		return
	}
	in, err := saga.ShowID(r.Context(), c.cfg.Store, name, id)
	switch {
	case errors.Is(err, projector.ErrNotFound):
		c.reply(w, r, http.StatusNotFound, err.Error())
		return
	case err != nil:
		c.log.Error("console: show saga instance", slog.String("saga", name), slog.String("id", id.String()), slog.Any("error", err))
		c.reply(w, r, http.StatusInternalServerError, err.Error())
		return
	}
	var note string
	if !c.cfg.ShowPayloads {
		in.State = nil
	} else if note, err = saga.OpenState(r.Context(), c.cfg.Store, &in, c.cfg.SagaPersonal[name],
		"the console was not given saga "+projector.Printable(name)+"'s personal declaration (console.Config.SagaPersonal)"); err != nil {
		c.log.Error("console: open saga state", slog.String("saga", name), slog.String("id", id.String()), slog.Any("error", err))
		c.reply(w, r, http.StatusInternalServerError, err.Error())
		return
	}
	d := c.page(r, fmt.Sprintf("Saga %s %s", name, in.Key), nil)
	d.SagaName, d.SagaInstance, d.SagaStateNote = name, &in, note
	c.render(w, r, http.StatusOK, "saga-instance.html", d)
}
