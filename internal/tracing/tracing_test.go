package tracing

import (
	"context"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/trace"
)

func spanContext(t *testing.T, state string) trace.SpanContext {
	t.Helper()
	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	ts, err := trace.ParseTraceState(state)
	if err != nil {
		t.Fatal(err)
	}
	return trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled, TraceState: ts})
}

func TestInjectExtractRoundTrip(t *testing.T) {
	sc := spanContext(t, "vendor=1")
	ctx := trace.ContextWithSpanContext(context.Background(), sc)
	h := Inject(ctx, map[string]string{"client": "web", HeaderTraceState: "stale=1"})
	if h[HeaderTraceParent] != "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01" || h[HeaderTraceState] != "vendor=1" || h["client"] != "web" {
		t.Fatalf("injected headers %v", h)
	}
	if got := Extract(h); !got.Equal(sc.WithRemote(true)) {
		t.Fatalf("extracted %v, want %v", got, sc)
	}
	// Without a tracestate the stale one must go, not survive.
	h = Inject(trace.ContextWithSpanContext(context.Background(), spanContext(t, "")), map[string]string{HeaderTraceState: "stale=1"})
	if _, ok := h[HeaderTraceState]; ok {
		t.Fatalf("stale tracestate kept: %v", h)
	}
}

func TestExtractIgnoresBadHeaders(t *testing.T) {
	for _, tp := range []string{
		"",
		"garbage",
		"00-00000000000000000000000000000000-00f067aa0ba902b7-01", // zero trace id
		"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", // zero span id
		"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", // forbidden version
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01" + strings.Repeat("x", 1<<16),
		"00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01", // upper case
	} {
		if sc := Extract(map[string]string{HeaderTraceParent: tp}); sc.IsValid() {
			t.Errorf("traceparent %.60q gave a valid span context %v", tp, sc)
		}
	}
	if sc := Extract(nil); sc.IsValid() {
		t.Error("nil headers gave a valid span context")
	}
}

// FuzzExtract: whatever a stored event's headers hold, Extract returns
// without panicking, and a context it accepts round-trips.
func FuzzExtract(f *testing.F) {
	f.Add("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "vendor=1")
	f.Add("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00", "")
	f.Add("garbage", "=,=,")
	f.Fuzz(func(t *testing.T, traceparent, tracestate string) {
		sc := Extract(map[string]string{HeaderTraceParent: traceparent, HeaderTraceState: tracestate})
		if !sc.IsValid() {
			return
		}
		again := Extract(Inject(trace.ContextWithSpanContext(context.Background(), sc), nil))
		if !again.Equal(sc) {
			t.Fatalf("round trip changed %v into %v", sc, again)
		}
	})
}
