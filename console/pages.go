package console

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/saga"
)

// pageData is what every template gets.
type pageData struct {
	Title string
	// Base is the path the console is mounted at ("" at the root).
	Base string
	// Schema is the store's schema, named in every page's header.
	Schema string
	// Live: the page updates itself every second (the dashboard), and its
	// header says whether it still does.
	Live     bool
	ReadOnly bool
	Operator string
	CSRF     string
	Tail     bool
	// TailTypes is the JSON list of event types the tail listens for (an
	// SSE message named by its event type reaches only a listener of that
	// name).
	TailTypes    string
	ShowPayloads bool
	State        *State
	Err          string
	// Message and Code are an action's result (result.html).
	Message string
	Code    int
	// DeadLetters, Filter and Next are the dead-letter list's: the page,
	// the status shown, and the id to page on from (0 on the last page).
	DeadLetters []projection.DeadLetter
	Filter      string
	Next        int64
	// Parks is the parked-streams list's page (Filter and Next as above).
	Parks []projection.Park
	// RelayParks are the JetStream parks page's (Filter and Next as
	// above) for Subscription, one of Subscriptions (the configured claims
	// consumers').
	RelayParks    []RelayPark
	Subscription  string
	Subscriptions []string
	// RelayParking: the console has JetStream consumers (their page is in
	// the navigation).
	RelayParking bool
	// DeadLetter and Event are the single dead-letter view's.
	DeadLetter *projection.DeadLetter
	Event      *projector.Event
	// SagaSummaries are the saga list's rows.
	SagaSummaries []saga.Summary
	// SagaName, SagaSummary and SagaInstances are one saga's instance
	// list, with Filter (the status shown), Tenant and Limit its filters.
	SagaName      string
	SagaSummary   *saga.Summary
	SagaInstances []saga.InstanceInfo
	Tenant        string
	Limit         int
	// SagaInstance is the single saga instance view's; SagaStateNote says
	// what became of its state's sealed personal fields (saga.OpenState).
	SagaInstance  *saga.InstanceDetail
	SagaStateNote string
	// rebuildable names the projections a rebuild button is offered for.
	rebuildable map[string]bool
}

// page is the data every page starts from.
func (c *Console) page(r *http.Request, title string, st *State) pageData {
	o := c.who(r)
	d := pageData{Title: title, Base: base(r), Schema: c.cfg.Store.Schema(), ReadOnly: c.ReadOnly(), Operator: o.name, CSRF: c.csrfToken(o),
		Tail: c.cfg.Tail != nil, TailTypes: c.tailTypes, ShowPayloads: c.cfg.ShowPayloads, State: st, rebuildable: c.rebuildable,
		RelayParking: len(c.cfg.JetStreamConsumers) > 0}
	if o.bearer {
		d.Operator = ""
	}
	return d
}

// render executes a template into a buffer first, so a failure midway
// sends a clean error rather than half a page.
func (c *Console) render(w http.ResponseWriter, r *http.Request, code int, name string, d pageData) {
	var buf bytes.Buffer
	if err := c.pages.ExecuteTemplate(&buf, name, d); err != nil {
		c.log.Error("console: render", slog.String("template", name), slog.Any("error", err))
		http.Error(w, "console: render failed", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(code)
	_, _ = buf.WriteTo(w)
}

// reply answers an action or a refused request: JSON for the page's
// script (it asks with Accept: application/json), else a small page with a
// link back, so the forms work without JavaScript too.
// clip renders stored or echoed text for a cell, an attribute or a reply on
// one line: runs of white space become one space, what a terminal would
// obey (ESC and the other control characters: a page may be read with
// curl) is escaped where it stands, and past n bytes it is cut.
func clip(n int, s string) string {
	return cutText(projector.EscapeControls(strings.Join(strings.Fields(s), " ")), n)
}

// cutText is s cut at n bytes on a rune boundary, "…" marking the cut.
func cutText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

// maxReply bounds a reply's message: an echoed 300,000-character query
// parameter made a 1.2 MB error page.
const maxReply = 2000

func (c *Console) reply(w http.ResponseWriter, r *http.Request, code int, msg string) {
	msg = clip(maxReply, msg)
	if strings.Contains(r.Header.Get("Accept"), "application/json") {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		_ = json.NewEncoder(w).Encode(struct {
			OK      bool   `json:"ok"`
			Message string `json:"message"`
		}{code < 400, msg})
		return
	}
	d := c.page(r, "Result", nil)
	d.Message, d.Code = msg, code
	c.render(w, r, code, "result.html", d)
}

func (c *Console) dashboard(w http.ResponseWriter, r *http.Request) {
	st, err := c.read(r.Context())
	d := c.page(r, "Projector console", &st)
	d.Live = true
	if err != nil {
		c.log.Error("console: read", slog.Any("error", err))
		d.Err = err.Error()
	}
	c.render(w, r, http.StatusOK, "dashboard.html", d)
}

// fragment is the dashboard's live part, which the page's script fetches
// every second and swaps in.
func (c *Console) fragment(w http.ResponseWriter, r *http.Request) {
	st, err := c.read(r.Context())
	d := c.page(r, "", &st)
	code := http.StatusOK
	if err != nil {
		c.log.Error("console: read", slog.Any("error", err))
		d.Err, code = err.Error(), http.StatusServiceUnavailable
	}
	c.render(w, r, code, "live", d)
}

// stateJSON is the dashboard's state for scripts and monitors: the same
// shards, horizon, rebuilds, dead letters and sagas, never a payload.
func (c *Console) stateJSON(w http.ResponseWriter, r *http.Request) {
	st, err := c.read(r.Context())
	if err != nil {
		c.log.Error("console: read", slog.Any("error", err))
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(st)
}

// deadLetters lists dead letters of one status (open by default, or
// resolved, discarded, all), oldest first, a page of DeadLetterLimit at a
// time: ?status=…&after=ID.
func (c *Console) deadLetters(w http.ResponseWriter, r *http.Request) {
	f := projection.DeadLetterFilter{Limit: c.cfg.DeadLetterLimit}
	filter, ok := c.listParams(w, r, "dead-letter", &f.Status, &f.AfterID,
		projection.DeadLetterOpen, projection.DeadLetterResolved, projection.DeadLetterDiscarded)
	if !ok {
		return
	}
	dls, err := projection.ListDeadLetters(r.Context(), c.cfg.Store, f)
	if err != nil {
		c.log.Error("console: list dead letters", slog.Any("error", err))
		c.reply(w, r, http.StatusInternalServerError, err.Error())
		return
	}
	d := c.page(r, "Dead letters", nil)
	d.DeadLetters, d.Filter = dls, filter
	if len(dls) == f.Limit {
		d.Next = dls[len(dls)-1].ID
	}
	c.render(w, r, http.StatusOK, "deadletters.html", d)
}

// deadLetter is the single dead-letter view: the record, the event's
// envelope, and its payload only when Config.ShowPayloads.
func (c *Console) deadLetter(w http.ResponseWriter, r *http.Request) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id < 1 {
		c.reply(w, r, http.StatusBadRequest, fmt.Sprintf("%v: dead-letter id %q: want a positive number", ErrInvalidInput, r.PathValue("id")))
		return
	}
	dl, ev, err := projection.GetDeadLetterRaw(r.Context(), c.cfg.Store, id)
	switch {
	case errors.Is(err, projector.ErrNotFound):
		c.reply(w, r, http.StatusNotFound, err.Error())
		return
	case err != nil:
		c.log.Error("console: read dead letter", slog.Int64("id", id), slog.Any("error", err))
		c.reply(w, r, http.StatusInternalServerError, err.Error())
		return
	}
	d := c.page(r, fmt.Sprintf("Dead letter %d", id), nil)
	d.DeadLetter, d.Event = &dl, ev
	c.render(w, r, http.StatusOK, "deadletter.html", d)
}

// funcs are the templates' helpers.
var funcs = template.FuncMap{
	"cursor":    cursorText,
	"printable": projector.Printable,
	"lagAge": func(seconds float64) string {
		if seconds <= 0 {
			return "-"
		}
		return human(time.Duration(seconds * float64(time.Second)))
	},
	"ago": func(t time.Time) string {
		if t.IsZero() {
			return "-"
		}
		d := time.Since(t)
		if d < time.Second && d > -time.Second {
			return "just now"
		}
		if d < 0 {
			return "in " + human(-d)
		}
		return human(d) + " ago"
	},
	// overdue: t (a timeout's due time) has passed.
	"overdue": func(t time.Time) bool { return !t.IsZero() && time.Now().After(t) },
	// path escapes a name for a URL's path segment.
	"path": url.PathEscape,
	"when": func(t time.Time) string {
		if t.IsZero() {
			return ""
		}
		return t.UTC().Format(time.RFC3339)
	},
	"rate": func(r float64) string {
		switch {
		case r < 0:
			return "-"
		case r < 10:
			return strconv.FormatFloat(r, 'f', 1, 64) + "/s"
		}
		return strconv.FormatFloat(r, 'f', 0, 64) + "/s"
	},
	// skew renders a partition's skew, "-" while there are too few events
	// to tell.
	"skew": func(f float64) string {
		if f <= 0 {
			return "-"
		}
		return strconv.FormatFloat(f, 'f', 2, 64)
	},
	"skewMark": func() string { return strconv.FormatFloat(projection.HotSkew, 'f', -1, 64) },
	"pct":      func(f float64) string { return strconv.FormatFloat(100*f, 'f', 0, 64) },
	"clip":     clip,
	// printableText is stored text shown whole on a page of its own (a
	// dead letter's error), its lines kept, anything a terminal would obey
	// escaped, and cut at MaxErrorBytes.
	"printableText": func(s string) string {
		lines := strings.Split(s, "\n")
		for i, l := range lines {
			lines[i] = projector.EscapeControls(strings.TrimSuffix(l, "\r"))
		}
		return cutText(strings.Join(lines, "\n"), projection.MaxErrorBytes)
	},
	"shared": func(s string) bool { return s == projection.SharedInstance },
	"shadow": func(s string) bool { return s == projection.RebuildInstance },
	"json": func(b []byte) string {
		var out bytes.Buffer
		if err := json.Indent(&out, b, "", "  "); err != nil {
			return string(b)
		}
		return out.String()
	},
	"headers": func(h map[string]string) string {
		b, _ := json.MarshalIndent(h, "", "  ")
		return string(b)
	},
	"done": func(total, remaining int64) int64 { return total - remaining },
	"actionsFor": func(sh Shard, p pageData) map[string]any {
		return map[string]any{"P": p, "Ops": shardActions(sh, p.rebuildable[sh.Consumer])}
	},
	"list": func(v ...string) []string { return v },
	"dict": func(kv ...any) (map[string]any, error) {
		if len(kv)%2 != 0 {
			return nil, errors.New("dict: odd number of arguments")
		}
		m := make(map[string]any, len(kv)/2)
		for i := 0; i < len(kv); i += 2 {
			k, ok := kv[i].(string)
			if !ok {
				return nil, errors.New("dict: a key is not a string")
			}
			m[k] = kv[i+1]
		}
		return m, nil
	},
}

// human renders a duration at a glance: two units at most ("10m54s",
// "2h5m", "3d4h"), milliseconds only below a second, as the CLI does.
func human(d time.Duration) string {
	switch {
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(time.Second).String()
	case d < time.Hour:
		d = d.Round(time.Second)
		return fmt.Sprintf("%dm%02ds", d/time.Minute, (d%time.Minute)/time.Second)
	case d < 24*time.Hour:
		d = d.Round(time.Minute)
		return fmt.Sprintf("%dh%02dm", d/time.Hour, (d%time.Hour)/time.Minute)
	}
	d = d.Round(time.Hour)
	return fmt.Sprintf("%dd%dh", d/(24*time.Hour), (d%(24*time.Hour))/time.Hour)
}

// listParams reads the parameters of a page of records (dead letters,
// parks): ?status=, one of statuses (the first when empty) or all (status
// "" then), and ?after=ID, the last id of the previous page. It returns
// the filter the page shows, or replies 400 and false when one is bad.
func (c *Console) listParams(w http.ResponseWriter, r *http.Request, what string, status *string, after *int64, statuses ...string) (string, bool) {
	q := r.URL.Query()
	*status = q.Get("status")
	switch {
	case *status == "":
		*status = statuses[0]
	case *status != "all" && !slices.Contains(statuses, *status):
		c.reply(w, r, http.StatusBadRequest, fmt.Sprintf("%v: status %q: want %s or all", ErrInvalidInput, *status, strings.Join(statuses, ", ")))
		return "", false
	}
	filter := *status
	if *status == "all" {
		*status = ""
	}
	if a := q.Get("after"); a != "" {
		n, err := strconv.ParseInt(a, 10, 64)
		if err != nil || n < 0 {
			c.reply(w, r, http.StatusBadRequest, fmt.Sprintf("%v: after %q: want a %s id", ErrInvalidInput, a, what))
			return "", false
		}
		*after = n
	}
	return filter, true
}

// parked is the list of parked streams (ParkStream consumers), open ones by
// default, with retry and discard for a signed-in operator.
func (c *Console) parked(w http.ResponseWriter, r *http.Request) {
	f := projection.ParkFilter{Limit: c.cfg.DeadLetterLimit}
	filter, ok := c.listParams(w, r, "park", &f.Status, &f.AfterID, projection.ParkOpen, projection.ParkResolved, projection.ParkDiscarded)
	if !ok {
		return
	}
	parks, err := projection.ListParks(r.Context(), c.cfg.Store, f)
	if err != nil {
		c.log.Error("console: list parks", slog.Any("error", err))
		c.reply(w, r, http.StatusInternalServerError, err.Error())
		return
	}
	d := c.page(r, "Parked streams", nil)
	d.Parks, d.Filter = parks, filter
	if len(parks) == f.Limit {
		d.Next = parks[len(parks)-1].ID
	}
	c.render(w, r, http.StatusOK, "parked.html", d)
}
