package console

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/rebuild"
	"github.com/projectorhq/projector/stores/postgres"
)

// consumerOps are the consumer actions: the same guarded transitions of
// projection.Admin that `projector consumer restart|skip|disable|enable`
// runs.
var consumerOps = map[string]func(*projection.Admin, context.Context, projection.ShardID) error{
	"restart": (*projection.Admin).Restart,
	"skip":    (*projection.Admin).Skip,
	"disable": (*projection.Admin).Disable,
	"enable":  (*projection.Admin).Enable,
}

// action serves POST /actions/{kind}/{op}: it checks, in order, that the
// console has a token, that the request is signed in, that a cookie session
// sent its CSRF token (the same-origin check ran before, in
// http.CrossOriginProtection), and that the input is valid; then it runs the
// library call the CLI runs and logs who did what with which result.
func (c *Console) action(w http.ResponseWriter, r *http.Request) {
	if c.ReadOnly() {
		c.deny(w, r, http.StatusForbidden, "this console is read-only: no "+EnvToken+" is configured")
		return
	}
	if !c.readForm(w, r) {
		return
	}
	o, r := c.whoOnce(r)
	if o.retry > 0 {
		c.log.Warn("console: request refused", slog.String("remote", remote(r)), slog.String("method", r.Method),
			slog.String("path", requestPath(r)), slog.Int("status", http.StatusTooManyRequests), slog.String("why", "too many wrong tokens"))
		c.tooMany(w, r, o.retry)
		return
	}
	if !o.ok() {
		msg := "sign in with the operator token first"
		if r.Header.Get("Authorization") != "" {
			// A script's header, not a browser's missing session.
			msg = "the Authorization header is not \"Bearer \" and the operator token (" + EnvToken + ")"
		}
		c.deny(w, r, http.StatusUnauthorized, msg)
		return
	}
	if !c.csrfOK(r, o) {
		c.deny(w, r, http.StatusForbidden, "missing or wrong CSRF token")
		return
	}
	kind, op := r.PathValue("kind"), r.PathValue("op")
	what := kind + " " + op
	target, run, err := c.plan(r, kind, op)
	if err != nil {
		code := http.StatusBadRequest
		if !errors.Is(err, ErrInvalidInput) {
			code = http.StatusNotFound
		}
		c.log.Warn("console: action refused", slog.String("who", o.name), slog.String("remote", remote(r)),
			slog.String("action", what), slog.String("result", "bad request"), slog.Any("error", err))
		c.reply(w, r, code, err.Error())
		return
	}
	msg, err := run(r.Context())
	c.invalidate()
	result, code := "ok", http.StatusOK
	switch {
	case err == nil:
	case errors.Is(err, projector.ErrNotFound):
		result, code = "not found", http.StatusNotFound
	case refusal(err):
		result, code = "refused", http.StatusConflict
	case postgres.IsInsufficientPrivilege(err):
		// The console's database role is read-only (or narrower than
		// the action needs): the operator's right, not the server's fault.
		result, code = "forbidden", http.StatusForbidden
		err = fmt.Errorf("the console's database role may not do this (docs/operations.md, \"Roles and privileges\"): %w", err)
	default:
		result, code = "error", http.StatusInternalServerError
	}
	attrs := []any{slog.String("who", o.name), slog.String("remote", remote(r)), slog.String("action", what),
		slog.String("target", target), slog.String("result", result)}
	if err != nil {
		msg = err.Error()
		attrs = append(attrs, slog.Any("error", err))
	}
	c.log.Info("console: action", attrs...)
	c.reply(w, r, code, msg)
}

// maxForm bounds an action's or a login's form: a few names and tokens.
const maxForm = 8 << 10

// readForm reads the request's form, at most maxForm bytes of it, and
// answers a body over that 413 and one that does not parse 400: read
// lazily, an oversized body read as an empty form, and the action said
// "no consumer" (or the login "wrong token", logged as a refused login).
func (c *Console) readForm(w http.ResponseWriter, r *http.Request) bool {
	r.Body = http.MaxBytesReader(w, r.Body, maxForm)
	err := r.ParseForm()
	var tooBig *http.MaxBytesError
	switch {
	case errors.As(err, &tooBig):
		c.deny(w, r, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body over %d bytes", maxForm))
		return false
	case err != nil:
		c.deny(w, r, http.StatusBadRequest, "the request body is not a form")
		return false
	}
	return true
}

// refusal reports an error that is a guarded transition's "not now": the
// state does not allow it and nothing changed (the CLI's exit code 3).
func refusal(err error) bool {
	return errors.Is(err, projector.ErrInvalidTransition) || errors.Is(err, rebuild.ErrActive) || errors.Is(err, rebuild.ErrNotActive) ||
		errors.Is(err, rebuild.ErrNoTables) || errors.Is(err, rebuild.ErrNotRebuildable) || errors.Is(err, rebuild.ErrPruned) ||
		errors.Is(err, rebuild.ErrNotReady) || errors.Is(err, rebuild.ErrNoPrimaryKey) || errors.Is(err, rebuild.ErrUnknownProjection)
}

// plan validates an action's input and returns what it acts on and the
// call that carries it out. An unknown kind or op matches ErrNotFound.
func (c *Console) plan(r *http.Request, kind, op string) (target string, run func(context.Context) (string, error), err error) {
	store := c.cfg.Store
	switch kind {
	case "consumer":
		fn, ok := consumerOps[op]
		if !ok {
			break
		}
		id := projection.ShardID{Consumer: r.PostFormValue("consumer"), Instance: r.PostFormValue("instance")}
		if id.Instance == "" {
			id.Instance = projection.SharedInstance
		}
		if err := checkName("consumer", id.Consumer); err != nil {
			return "", nil, err
		}
		if err := checkName("instance", id.Instance); err != nil {
			return "", nil, err
		}
		return id.String(), func(ctx context.Context) (string, error) {
			admin := projection.NewAdmin(store)
			if err := fn(admin, ctx, id); err != nil {
				return "", err
			}
			st, err := admin.Status(ctx, id)
			if err != nil {
				return "", err
			}
			return fmt.Sprintf("%s %s: now %s at %s", op, id, st.Status, cursorText(st.Cursor)), nil
		}, nil
	case "dead-letter":
		if op != "retry" && op != "discard" {
			break
		}
		id, err := strconv.ParseInt(strings.TrimSpace(r.PostFormValue("id")), 10, 64)
		if err != nil || id < 1 {
			return "", nil, fmt.Errorf("%w: dead-letter id %q: want a positive number", ErrInvalidInput, r.PostFormValue("id"))
		}
		return "dead letter " + strconv.FormatInt(id, 10), func(ctx context.Context) (string, error) {
			if op == "discard" {
				if err := projection.DiscardDeadLetters(ctx, store, []int64{id}); err != nil {
					return "", err
				}
				return fmt.Sprintf("dead letter %d discarded", id), nil
			}
			// Recorded for a dispatcher that has the projection, as
			// `dead-letters retry` without --here: the handlers are that
			// process's code.
			if err := projection.RequestDeadLetterRetry(ctx, store, []int64{id}); err != nil {
				return "", err
			}
			return fmt.Sprintf("retry of dead letter %d requested: a dispatcher running its consumer carries it out", id), nil
		}, nil
	case "park":
		if op != "retry" && op != "discard" {
			break
		}
		id, err := strconv.ParseInt(strings.TrimSpace(r.PostFormValue("id")), 10, 64)
		if err != nil || id < 1 {
			return "", nil, fmt.Errorf("%w: park id %q: want a positive number", ErrInvalidInput, r.PostFormValue("id"))
		}
		// The park's record names who acted: the signed-in operator.
		by := "console: " + c.who(r).name
		return "park " + strconv.FormatInt(id, 10), func(ctx context.Context) (string, error) {
			if op == "discard" {
				p, err := projection.DiscardPark(ctx, store, id, by)
				if err != nil {
					return "", err
				}
				msg := fmt.Sprintf("park %d discarded: %d events of %s dropped, kept for the record", id, p.Events, p.What())
				if p.RetryRequestedAt != nil {
					msg += fmt.Sprintf("; this cancelled the retry requested at %s, which no dispatcher had carried out", p.RetryRequestedAt.UTC().Format(time.RFC3339))
				}
				return msg, nil
			}
			// A request, as `parked retry` without --here: the handlers are
			// a dispatcher's code.
			if err := projection.RequestParkRetry(ctx, store, id, by); err != nil {
				return "", err
			}
			return fmt.Sprintf("retry of park %d requested: a dispatcher running its consumer applies the parked sequence", id), nil
		}, nil
	case "relay-park":
		if op != "retry" && op != "discard" {
			break
		}
		return c.planRelayPark(r, op)
	case "rebuild":
		if op != "request" {
			break
		}
		name := r.PostFormValue("name")
		if err := checkName("projection", name); err != nil {
			return "", nil, err
		}
		mode := rebuild.Mode(r.PostFormValue("mode"))
		switch mode {
		case "":
			mode = rebuild.BlueGreen
		case rebuild.BlueGreen, rebuild.InPlace:
		default:
			return "", nil, fmt.Errorf("%w: rebuild mode %q: want %s or %s", ErrInvalidInput, mode, rebuild.BlueGreen, rebuild.InPlace)
		}
		return "projection " + name, func(ctx context.Context) (string, error) {
			rb, err := rebuild.Request(ctx, store, name, rebuild.Options{Mode: mode})
			if err != nil {
				return "", err
			}
			return fmt.Sprintf("rebuild %d of %s requested (v%d, %s): dispatchers running the projection carry it out", rb.ID, rb.Name, rb.Version, rb.Mode), nil
		}, nil
	}
	return "", nil, fmt.Errorf("no action %s %s: %w", kind, op, projector.ErrNotFound)
}
