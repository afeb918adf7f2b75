package live

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/hostcheck"
	"github.com/projectorhq/projector/stores/postgres"
)

// LastEventIDParam is the query parameter read when the Last-Event-ID
// header is absent: EventSource polyfills that cannot set headers send the
// last id there.
const LastEventIDParam = "lastEventId"

// TypesParam is the query parameter that narrows a stream to some of the
// feed's event types: comma-separated, or repeated.
const TypesParam = "types"

// pruneMargin widens the "pruned since" check of a resuming client: a
// prune records its time at its transaction's start, a little before it
// deletes.
const pruneMargin = time.Minute

// ServeHTTP streams the authorised tenant's events. Answers before the
// stream starts: 421 for a Host header that names no host the feed answers
// to ([Config.AllowedHosts]), 405 for anything but GET, 401/403 from the [Authorizer]
// (403 without one), 400 for an unknown or malformed `types` or a malformed
// Last-Event-ID, 500 when the log cannot be read, 503 once the feed is
// closed. Inside the stream: `event: reset` when the Last-Event-ID cannot be
// resumed exactly (see the package documentation), `event: dropped` before
// a slow client is disconnected.
func (f *Feed) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !f.hosts.Allowed(r) {
		f.logger.WarnContext(r.Context(), "live feed: request refused: Host is not this feed's (DNS rebinding?)",
			slog.String("host", projector.Printable(r.Host)), slog.String("remote", r.RemoteAddr))
		hostcheck.Refuse(w, "live feed")
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "live feed: use GET", http.StatusMethodNotAllowed)
		return
	}
	if f.cfg.Authorize == nil {
		f.logger.WarnContext(r.Context(), "live feed: request refused: no Authorize callback configured")
		http.Error(w, "live feed: no authorisation configured, every request is refused", http.StatusForbidden)
		return
	}
	tenant, err := f.cfg.Authorize(r)
	switch {
	case errors.Is(err, ErrUnauthenticated):
		http.Error(w, "live feed: authentication required", http.StatusUnauthorized)
		return
	case err != nil:
		f.logger.InfoContext(r.Context(), "live feed: request refused by Authorize", slog.Any("error", err))
		http.Error(w, "live feed: forbidden", http.StatusForbidden)
		return
	case tenant == "":
		http.Error(w, "live feed: forbidden (no tenant for this request)", http.StatusForbidden)
		return
	}
	if verr := projector.TenantStream(tenant, "-", "-").Validate(); verr != nil {
		f.logger.ErrorContext(r.Context(), "live feed: Authorize returned a tenant no stream can have", slog.Any("error", verr))
		http.Error(w, "live feed: forbidden", http.StatusForbidden)
		return
	}
	types, err := f.parseTypes(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var resume *projector.Position
	if id := lastEventID(r); id != "" {
		p, err := parseID(id)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		resume = &p
	}
	select {
	case <-f.hub.done:
		http.Error(w, "live feed: shutting down", http.StatusServiceUnavailable)
		return
	default:
	}
	if n := f.streams.Add(1); n > int64(f.cfg.MaxClients) {
		f.streams.Add(-1)
		f.logger.WarnContext(r.Context(), "live feed: request refused: too many streams", slog.Int("max_clients", f.cfg.MaxClients))
		w.Header().Set("Retry-After", "5")
		http.Error(w, "live feed: too many clients, retry later", http.StatusServiceUnavailable)
		return
	}
	defer f.streams.Add(-1)
	ctx := r.Context()
	s := &stream{f: f, w: w, rc: http.NewResponseController(w), tenant: tenant, types: types}
	var reset string
	if resume != nil {
		reset, err = f.resumable(ctx, *resume, tenant, s.readTypes())
		if err != nil {
			f.logger.ErrorContext(ctx, "live feed: cannot check Last-Event-ID", slog.Any("error", err))
			http.Error(w, "live feed: cannot read the log", http.StatusInternalServerError)
			return
		}
	}
	if resume == nil || reset != "" {
		h, err := f.cfg.Store.Horizon(ctx)
		if err != nil {
			f.logger.ErrorContext(ctx, "live feed: cannot read the log horizon", slog.Any("error", err))
			http.Error(w, "live feed: cannot read the log", http.StatusInternalServerError)
			return
		}
		s.cursor = h
	} else {
		s.cursor = *resume
	}
	hdr := w.Header()
	hdr.Set("Content-Type", "text/event-stream")
	hdr.Set("Cache-Control", "no-store")
	hdr.Set("X-Accel-Buffering", "no") // nginx: do not buffer the stream
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodHead {
		return
	}
	if err := s.run(ctx, reset, resume); err != nil && ctx.Err() == nil {
		f.logger.InfoContext(ctx, "live feed: stream ended", slog.String("tenant", projector.Printable(tenant)), slog.Any("error", err))
	}
}

// lastEventID is the header, else the query parameter fallback.
func lastEventID(r *http.Request) string {
	if v := r.Header.Get("Last-Event-ID"); v != "" {
		return v
	}
	return r.URL.Query().Get(LastEventIDParam)
}

// parseID parses an id the feed sent: an event's position, "txid/seq".
func parseID(id string) (projector.Position, error) {
	const bad = "live feed: malformed Last-Event-ID %s: want the id of a message this feed sent (txid/seq)"
	if len(id) > 41 {
		return projector.Position{}, fmt.Errorf(bad, projector.Printable(id[:41]+"…"))
	}
	p, err := projector.ParsePosition(id)
	if err != nil || p.Seq == math.MaxInt64 || p.TxID == 0 || p.Seq == 0 {
		return projector.Position{}, fmt.Errorf(bad, projector.Printable(id))
	}
	return p, nil
}

// parseTypes reads ?types=, which may only narrow the served types; nil
// means all of them.
func (f *Feed) parseTypes(r *http.Request) (map[string]bool, error) {
	vals := r.URL.Query()[TypesParam]
	if len(vals) == 0 {
		return nil, nil
	}
	types := map[string]bool{}
	for _, v := range vals {
		for t := range strings.SplitSeq(v, ",") {
			t = strings.TrimSpace(t)
			if t == "" {
				continue
			}
			if !f.served[t] {
				return nil, fmt.Errorf("live feed: event type %s is not served by this feed", projector.Printable(t))
			}
			types[t] = true
			if len(types) > MaxTypes {
				return nil, fmt.Errorf("live feed: more than %d event types", MaxTypes)
			}
		}
	}
	if len(types) == 0 {
		return nil, fmt.Errorf("live feed: %s names no event type", TypesParam)
	}
	return types, nil
}

// resumable says why a client cannot resume exactly after p, or "" when it
// can: p must name an event of the tenant that is still in the log, and
// retention must not have deleted events of the client's types since that
// event was recorded (projector_pruned records, per type, when it last
// did). The check is conservative: it may send a reset when nothing the
// client wanted was deleted; it never lets a gap pass silently.
func (f *Feed) resumable(ctx context.Context, p projector.Position, tenant string, types []string) (string, error) {
	st := f.cfg.Store
	var recorded time.Time
	// The event may have been archived since (`projector streams
	// archive`): it is still in the log, and the catch-up reads the archive.
	err := st.Pool().QueryRow(ctx, `SELECT recorded_at FROM `+st.Table("projector_events")+
		` WHERE tx_id = $1::text::xid8 AND seq = $2 AND tenant_id = $3
		UNION ALL SELECT recorded_at FROM `+st.Table("projector_events_archive")+
		` WHERE tx_id = $1::text::xid8 AND seq = $2 AND tenant_id = $3 LIMIT 1`, fmt.Sprint(p.TxID), p.Seq, tenant).Scan(&recorded)
	if errors.Is(err, pgx.ErrNoRows) {
		return "the event this Last-Event-ID names is no longer in the log (deleted by retention) or never was", nil
	}
	if err != nil {
		return "", fmt.Errorf("look up event %s: %w", p, err)
	}
	var pruned []string
	rows, err := st.Pool().Query(ctx, `SELECT event_type FROM `+st.Table("projector_pruned")+
		` WHERE event_type = ANY($1) AND last_at >= $2 ORDER BY 1`, types, recorded.Add(-pruneMargin))
	if err != nil {
		return "", fmt.Errorf("read pruned types: %w", err)
	}
	pruned, err = pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return "", fmt.Errorf("read pruned types: %w", err)
	}
	if len(pruned) > 0 {
		return "retention deleted events of " + strings.Join(pruned, ", ") + " after this Last-Event-ID was sent", nil
	}
	return "", nil
}

// stream is one client's connection.
type stream struct {
	f      *Feed
	w      http.ResponseWriter
	rc     *http.ResponseController
	tenant string
	types  map[string]bool
	// cursor: every event of the client's up to here has been sent.
	cursor projector.Position
}

// readTypes is the type filter of the client's log reads.
func (s *stream) readTypes() []string {
	if s.types == nil {
		return s.f.types
	}
	out := make([]string, 0, len(s.types))
	for t := range s.types {
		out = append(out, t)
	}
	slices.Sort(out)
	return out
}

func (s *stream) wants(ev *projector.Event) bool {
	return ev.Stream.Tenant == s.tenant && s.f.served[ev.Type] && (s.types == nil || s.types[ev.Type])
}

// write sends b under the write timeout.
func (s *stream) write(b []byte) error {
	if err := s.rc.SetWriteDeadline(time.Now().Add(s.f.cfg.WriteTimeout)); err != nil && !errors.Is(err, http.ErrNotSupported) {
		return err
	}
	_, err := s.w.Write(b)
	return err
}

func (s *stream) flush() error {
	if err := s.rc.Flush(); err != nil {
		return fmt.Errorf("flush: %w", err)
	}
	return nil
}

// control sends a named control event with a JSON reason.
func (s *stream) control(event, reason string, extra map[string]string) error {
	m := map[string]string{"reason": reason}
	for k, v := range extra {
		m[k] = v
	}
	data, _ := json.Marshal(m)
	return s.write([]byte("event: " + event + "\ndata: " + string(data) + "\n\n"))
}

// run catches the client up from the log, joins the fan-out and streams
// until the client goes, the feed closes or the client is dropped.
func (s *stream) run(ctx context.Context, reset string, resume *projector.Position) error {
	if err := s.write([]byte(": projector live feed\nretry: 2000\n\n")); err != nil {
		return err
	}
	if reset != "" {
		if err := s.control("reset", reset, map[string]string{"last_event_id": resume.String()}); err != nil {
			return err
		}
	}
	if err := s.catchUp(ctx, nil); err != nil {
		return err
	}
	if s.f.joining != nil {
		s.f.joining()
	}
	c := &client{tenant: s.tenant, types: s.types, limit: s.f.cfg.BufferSize, notify: make(chan struct{}, 1)}
	last, known, ok := s.f.hub.add(c)
	if !ok {
		return s.shutdown()
	}
	defer s.f.hub.remove(c)
	if known && s.cursor.Less(last) {
		// A batch fanned out after the catch-up's read and before the
		// client joined reached no queue of its; a later batch would have
		// the client read the gap (deliver), but none may come, the
		// writers done: read up to where the fan-out stood when it joined.
		if err := s.catchUp(ctx, &last); err != nil {
			return err
		}
	}
	if err := s.flush(); err != nil {
		return err
	}
	beat := time.NewTicker(s.f.cfg.Heartbeat)
	defer beat.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-s.f.hub.done:
			return s.shutdown()
		case <-beat.C:
			if err := s.write([]byte(": heartbeat\n\n")); err != nil {
				return err
			}
			if err := s.flush(); err != nil {
				return err
			}
		case <-c.notify:
			ds, dropped := c.take()
			if dropped != "" {
				s.f.logger.WarnContext(ctx, "live feed: slow client dropped", slog.String("tenant", projector.Printable(s.tenant)), slog.String("reason", dropped))
				if err := s.control("dropped", dropped, nil); err != nil {
					return err
				}
				_ = s.flush()
				return nil
			}
			for _, d := range ds {
				if err := s.deliver(ctx, d); err != nil {
					return err
				}
			}
			if err := s.flush(); err != nil {
				return err
			}
		}
	}
}

func (s *stream) shutdown() error {
	if err := s.write([]byte(": shutting down\n\n")); err != nil {
		return err
	}
	return s.flush()
}

// deliver sends a fan-out batch. The consumer delivered every event after
// d.prev up to d.last in it; if the client has everything up to d.prev, the
// batch's events past the cursor are exactly what it lacks. Otherwise (it
// joined mid-way, or the process just started) it reads the log up to d.last
// first, and the batch's events are then all behind its cursor.
func (s *stream) deliver(ctx context.Context, d delivery) error {
	if !d.prevKnown || s.cursor.Less(d.prev) {
		if err := s.catchUp(ctx, &d.last); err != nil {
			return err
		}
	}
	for _, fr := range d.frames {
		if !s.cursor.Less(fr.pos) {
			continue // already sent by a catch-up read
		}
		if err := s.write(fr.sse); err != nil {
			return err
		}
		s.cursor = fr.pos
	}
	if s.cursor.Less(d.last) {
		s.cursor = d.last
	}
	return nil
}

// catchUp reads the log after the cursor in bounded batches and sends the
// client's events, until a read comes back short (nil target) or the cursor
// reaches target. Every event of the client's below a short read's horizon
// is final, so the cursor may move there.
func (s *stream) catchUp(ctx context.Context, target *projector.Position) error {
	types := s.readTypes()
	var wait time.Duration
	for {
		// The archive is read too, in the same statement: a client resuming
		// from before streams were archived gets their events in their
		// places, and a stream archived while the client catches up is
		// never missed (the archive's guard waits for the feed's consumer,
		// not for its clients). Catch-up reads are the rare path.
		b, err := s.f.cfg.Store.ReadLog(ctx, postgres.LogQuery{After: s.cursor, Limit: s.f.cfg.CatchUpBatch, EventTypes: types, Raw: true,
			IncludeArchived: true})
		if err != nil {
			return fmt.Errorf("catch-up read after %s: %w", s.cursor, err)
		}
		for i := range b.Events {
			if ev := &b.Events[i]; s.wants(ev) {
				if err := s.write(s.f.render(ev).sse); err != nil {
					return err
				}
			}
		}
		s.cursor = b.Next(s.cursor)
		if b.Full {
			if err := s.flush(); err != nil {
				return err
			}
			continue
		}
		if target == nil || !s.cursor.Less(*target) {
			return nil
		}
		// The fan-out's events are committed and were read below an
		// earlier horizon, so a later read's horizon covers them; a read
		// that does not yet is retried, briefly.
		wait = min(max(2*wait, time.Millisecond), 100*time.Millisecond)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}
