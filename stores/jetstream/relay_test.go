package jetstream_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	pjs "github.com/projectorhq/projector/stores/jetstream"
)

func TestNewRelayRefusesBadConfig(t *testing.T) {
	e := newEnv(t)
	for _, tc := range []struct {
		name   string
		change func(*pjs.RelayConfig)
	}{
		{"wildcard prefix", func(c *pjs.RelayConfig) { c.Prefix = "events.*" }},
		{"full wildcard prefix", func(c *pjs.RelayConfig) { c.Prefix = "events.>" }},
		{"empty token", func(c *pjs.RelayConfig) { c.Prefix = "events..x" }},
		{"space in prefix", func(c *pjs.RelayConfig) { c.Prefix = "my events" }},
		{"stream name with a dot", func(c *pjs.RelayConfig) { c.Stream = "A.B" }},
		{"no connection", func(c *pjs.RelayConfig) { c.Conn = nil }},
		{"no registry", func(c *pjs.RelayConfig) { c.Registry = nil }},
		{"window shorter than a batch", func(c *pjs.RelayConfig) { c.DuplicateWindow = 30 * time.Second }},
		// Accepted until Ensure, or not at all (a relay and saga audit).
		{"seven replicas", func(c *pjs.RelayConfig) { c.Replicas = 7 }},
		{"a window of 200 years", func(c *pjs.RelayConfig) { c.DuplicateWindow = 200 * 365 * 24 * time.Hour }},
		{"a 1ns publish timeout", func(c *pjs.RelayConfig) { c.PublishTimeout = time.Nanosecond }},
		{"a trillion pending", func(c *pjs.RelayConfig) { c.MaxPending = 1e12 }},
		{"the inbox prefix", func(c *pjs.RelayConfig) { c.Prefix = "_INBOX" }},
		{"under the inbox prefix", func(c *pjs.RelayConfig) { c.Prefix = "_inbox.events" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := e.relayConfig()
			tc.change(&cfg)
			if _, err := pjs.NewRelay(cfg); !errors.Is(err, pjs.ErrInvalidConfig) {
				t.Fatalf("NewRelay: %v, want ErrInvalidConfig", err)
			}
		})
	}
}

// An existing stream that does not fit is refused and left untouched.
func TestEnsureRefusesStreamThatDoesNotFit(t *testing.T) {
	e := newEnv(t)
	js, err := jetstream.New(e.nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(e.ctx, 10*time.Second)
	defer cancel()
	for _, tc := range []struct {
		name string
		cfg  jetstream.StreamConfig
		want string
	}{
		{"short duplicate window", jetstream.StreamConfig{Subjects: []string{e.prefix + ".>"}, Duplicates: time.Minute, Storage: jetstream.FileStorage}, "duplicates"},
		{"other subjects", jetstream.StreamConfig{Subjects: []string{e.prefix + ".acme.>"}, Duplicates: time.Hour, Storage: jetstream.FileStorage}, "captures"},
		{"memory storage", jetstream.StreamConfig{Subjects: []string{e.prefix + ".>"}, Duplicates: time.Hour, Storage: jetstream.MemoryStorage}, "storage"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.Name = e.stream
			if _, err := js.CreateStream(ctx, tc.cfg); err != nil {
				t.Fatal(err)
			}
			defer func() {
				if err := js.DeleteStream(ctx, e.stream); err != nil {
					t.Fatal(err)
				}
			}()
			r, err := pjs.NewRelay(e.relayConfig())
			if err != nil {
				t.Fatal(err)
			}
			_, err = r.Ensure(ctx)
			if !errors.Is(err, pjs.ErrStreamMismatch) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Ensure: %v, want ErrStreamMismatch about %s", err, tc.want)
			}
			s, err := js.Stream(ctx, e.stream)
			if err != nil {
				t.Fatal(err)
			}
			if got := s.CachedInfo().Config; got.Duplicates != tc.cfg.Duplicates || got.Subjects[0] != tc.cfg.Subjects[0] {
				t.Fatalf("Ensure changed the stream: %+v", got)
			}
		})
	}
	// A fitting stream (longer window, same subjects) is accepted as is.
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: e.stream, Subjects: []string{e.prefix + ".>"}, Duplicates: time.Hour}); err != nil {
		t.Fatal(err)
	}
	r, err := pjs.NewRelay(e.relayConfig())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Ensure(ctx); err != nil {
		t.Fatalf("Ensure on a fitting stream: %v", err)
	}
}

// An event bigger than the server's max payload halts the relay at that
// event with a clear error: events before it are in the stream, nothing
// after it is published out of order, and nothing is skipped.
func TestRelayHaltsOnOversizeMessage(t *testing.T) {
	e := newEnv(t)
	cfg := e.relayConfig()
	cfg.Async.MaxAttempts = 2
	r := e.relay(cfg)
	e.append("acme", "big", testevents.TicketCommented{Body: "small", N: 1})
	e.append("acme", "big", testevents.TicketCommented{Body: strings.Repeat("x", int(e.nc.MaxPayload())+1), N: 2})
	e.append("acme", "big", testevents.TicketCommented{Body: "after", N: 3})
	e.dispatcher(r.Async())
	admin := projection.NewAdmin(e.store)
	var st projection.ShardState
	waitFor(t, "the relay to halt", 30*time.Second, func() bool {
		var err error
		st, err = admin.Status(e.ctx, projection.ShardID{Consumer: "jetstream_relay"})
		if err != nil {
			t.Fatal(err)
		}
		return st.Status == projection.StatusDead
	})
	if !strings.Contains(st.LastError, "max payload") {
		t.Fatalf("last error %q does not name the max payload", st.LastError)
	}
	msgs := e.streamMsgs(e.nc)
	if len(msgs) != 1 {
		t.Fatalf("%d messages in the stream, want only the one before the oversize event", len(msgs))
	}
	if got := msgs[0].Header.Get(pjs.HeaderVersion); got != "1" {
		t.Fatalf("stored version %s, want 1", got)
	}
}
