package live

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/tracing"
	"github.com/projectorhq/projector/projection"
)

// noop is the consumer's batch handler: the feed writes nothing in the
// dispatcher's transaction; its work happens after the commit.
func noop(context.Context, pgx.Tx, projection.Batch) error { return nil }

// frame is one event ready to send: rendered once, shared by every client
// that gets it.
type frame struct {
	pos    projector.Position
	tenant string
	typ    string
	sse    []byte
}

// delivery is one fan-out batch as one client sees it: its own events of
// the batch, and the positions that say whether the client may take them
// without reading the log (see stream.deliver).
type delivery struct {
	// prev is the last event position of the previous fan-out batch; the
	// consumer delivered every event between prev and this batch in it.
	prev projector.Position
	// prevKnown is false for the first batch after the process started:
	// where the consumer started is not known here.
	prevKnown bool
	// last is the last event position of this batch.
	last   projector.Position
	frames []*frame
}

// client is one connected, live stream as the hub sees it.
type client struct {
	tenant string
	types  map[string]bool // nil: every served type
	limit  int

	mu      sync.Mutex
	queue   []delivery
	queued  int    // cost of queue: events, at least one per delivery
	dropped string // why the hub dropped the client; set once
	notify  chan struct{}
}

// take returns what is queued and why the client was dropped, if it was.
func (c *client) take() ([]delivery, string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	q := c.queue
	c.queue, c.queued = nil, 0
	return q, c.dropped
}

func (c *client) wake() {
	select {
	case c.notify <- struct{}{}:
	default:
	}
}

// hub fans the consumer's committed batches out to the clients.
type hub struct {
	f       *Feed
	mu      sync.Mutex
	clients map[*client]struct{}
	last    projector.Position
	known   bool
	closed  bool
	done    chan struct{}
}

func newHub(f *Feed) *hub {
	return &hub{f: f, clients: map[*client]struct{}{}, done: make(chan struct{})}
}

func (h *hub) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.clients)
}

// add registers c and returns the last position the consumer fanned out
// before it (known false before the first batch); ok is false once the
// feed is closed. Every batch after that position is queued for c.
func (h *hub) add(c *client) (last projector.Position, known, ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return projector.Position{}, false, false
	}
	h.clients[c] = struct{}{}
	return h.last, h.known, true
}

func (h *hub) remove(c *client) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.clients, c)
}

func (h *hub) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.closed {
		h.closed = true
		close(h.done)
	}
}

// publish is the consumer's AfterCommit: it renders the batch once and
// queues each client's share, dropping a client whose queue would exceed its
// limit. It never blocks on a client.
func (h *hub) publish(events []projector.Event) {
	if len(events) == 0 {
		return
	}
	frames := make([]*frame, 0, len(events))
	for i := range events {
		if !h.f.served[events[i].Type] {
			continue
		}
		frames = append(frames, h.f.render(&events[i]))
	}
	last := events[len(events)-1].Position
	span := h.startSend(events, len(frames))
	var delivered, dropped int
	defer func() { h.endSend(span, delivered, dropped) }()
	h.mu.Lock()
	defer h.mu.Unlock()
	prev, known := h.last, h.known
	if known && last.Less(prev) {
		// The consumer was rewound (an operator reset it): its batches
		// repeat what clients already have, which they skip by position.
		// Keep the furthest position as the continuity mark.
		last = prev
	}
	h.last, h.known = last, true
	var mine []*frame
	for c := range h.clients {
		mine = mine[:0]
		for _, fr := range frames {
			if fr.tenant == c.tenant && (c.types == nil || c.types[fr.typ]) {
				mine = append(mine, fr)
			}
		}
		c.mu.Lock()
		if c.dropped == "" {
			cost := max(1, len(mine))
			if c.queued+cost > c.limit {
				dropped++
				c.dropped = "buffer full: more than " + strconv.Itoa(c.limit) + " events waiting for this client; reconnect with Last-Event-ID to resume"
				c.queue, c.queued = nil, 0
			} else {
				n := len(c.queue)
				if len(mine) == 0 && n > 0 && c.queue[n-1].last == prev {
					// Nothing for this client: extend the previous
					// delivery's continuity instead of queueing more.
					c.queue[n-1].last = last
				} else {
					c.queue = append(c.queue, delivery{prev: prev, prevKnown: known, last: last, frames: append([]*frame(nil), mine...)})
					c.queued += cost
					delivered += len(mine)
				}
			}
		}
		c.mu.Unlock()
		c.wake()
	}
}

// startSend starts the span of one fan-out: a root span (the batch was
// committed; its cause is each event's append) linked to the append of each
// event, up to [tracing.MaxLinks], like the dispatcher's batch span. With
// tracing off it only starts a non-recording span: no header is parsed.
func (h *hub) startSend(events []projector.Event, frames int) trace.Span {
	_, span := h.f.tracer.Start(context.Background(), "send "+h.f.cfg.Name, trace.WithSpanKind(trace.SpanKindProducer))
	if !span.IsRecording() {
		return span
	}
	linked, skipped := 0, 0
	for _, ev := range events {
		sc := tracing.Extract(ev.Metadata.Headers)
		switch {
		case !sc.IsValid():
		case linked == tracing.MaxLinks:
			skipped++
		default:
			span.AddLink(trace.Link{SpanContext: sc})
			linked++
		}
	}
	span.SetAttributes(
		tracing.AttrMessagingSystem.String(tracing.MessagingSystem),
		tracing.AttrMessagingOperationName.String("send"),
		tracing.AttrMessagingOperationType.String("send"),
		tracing.AttrMessagingDestination.String(h.f.cfg.Name),
		tracing.AttrMessagingBatchCount.Int(frames),
		tracing.AttrPositionFirst.String(events[0].Position.String()),
		tracing.AttrPositionLast.String(events[len(events)-1].Position.String()),
		tracing.AttrLinksDropped.Int(skipped),
	)
	return span
}

// endSend ends a fan-out's span with what it did: the messages queued for
// clients and the clients dropped for a full buffer.
func (h *hub) endSend(span trace.Span, delivered, dropped int) {
	if span.IsRecording() {
		span.SetAttributes(
			attribute.Int("projector.live.clients", h.count()),
			attribute.Int("projector.live.delivered", delivered),
			attribute.Int("projector.live.dropped", dropped),
		)
	}
	span.End()
}

// envelope is the JSON of an SSE message's data.
type envelope struct {
	ID         string          `json:"id"`
	Position   string          `json:"position"`
	Type       string          `json:"type"`
	Tenant     string          `json:"tenant"`
	Stream     streamJSON      `json:"stream"`
	Version    int64           `json:"version"`
	RecordedAt time.Time       `json:"recorded_at"`
	Payload    json.RawMessage `json:"payload,omitempty"`
}

type streamJSON struct {
	Type string `json:"type"`
	ID   string `json:"id"`
}

// render turns an event into its SSE message. Event type names are
// validated at definition, so they hold no newline; the JSON has none.
func (f *Feed) render(ev *projector.Event) *frame {
	env := envelope{
		ID: ev.ID.String(), Position: ev.Position.String(), Type: ev.Type, Tenant: ev.Stream.Tenant,
		Stream: streamJSON{Type: ev.Stream.Type, ID: ev.Stream.ID}, Version: ev.Version, RecordedAt: ev.RecordedAt,
	}
	if f.cfg.Payloads {
		env.Payload = ev.Data
	}
	data, err := json.Marshal(env)
	if err != nil {
		// Only the payload can fail (it is jsonb, so it cannot); say so
		// rather than send a broken message.
		env.Payload = nil
		data, _ = json.Marshal(env)
	}
	var b strings.Builder
	b.Grow(len(data) + len(ev.Type) + 48)
	b.WriteString("id: ")
	b.WriteString(env.Position)
	b.WriteString("\nevent: ")
	b.WriteString(sseSafe(ev.Type))
	b.WriteString("\ndata: ")
	b.Write(data)
	b.WriteString("\n\n")
	return &frame{pos: ev.Position, tenant: ev.Stream.Tenant, typ: ev.Type, sse: []byte(b.String())}
}

// sseSafe keeps a field on one line whatever it holds.
func sseSafe(s string) string {
	if strings.ContainsAny(s, "\r\n") {
		return strings.NewReplacer("\r", " ", "\n", " ").Replace(s)
	}
	return s
}
