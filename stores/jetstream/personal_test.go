package jetstream_test

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	pjs "github.com/projectorhq/projector/stores/jetstream"
	"github.com/projectorhq/projector/stores/postgres"
)

// personalEnv is env over a registry with personal fields and a store
// with a master key, and the relay of its log.
type personalEnv struct {
	*env
	personal testevents.PersonalTypes
	relay    *pjs.Relay
}

func newPersonalEnv(t *testing.T) *personalEnv {
	t.Helper()
	types := testevents.NewPersonal()
	master, err := postgres.NewMasterKey("relay", testevents.MasterKey("relay"))
	if err != nil {
		t.Fatal(err)
	}
	id := randomHex(6)
	e := &env{t: t, ctx: context.Background(), store: pgtest.Store(t, types.Registry, postgres.Config{MasterKey: master}),
		url: natsURL(), nc: connect(t, natsURL()), stream: "T_" + id, prefix: "t" + id}
	t.Cleanup(func() {
		if js, err := jetstream.New(e.nc); err == nil {
			_ = js.DeleteStream(context.Background(), e.stream)
		}
	})
	pe := &personalEnv{env: e, personal: types}
	cfg := e.relayConfig()
	cfg.Registry = types.Registry
	pe.relay = e.relay(cfg)
	return pe
}

// register appends a customer.registered of customer to its profile
// stream.
func (e *personalEnv) register(tenant, customer, name, email, plan string) {
	e.t.Helper()
	err := pgx.BeginFunc(e.ctx, e.store.Pool(), func(tx pgx.Tx) error {
		_, err := e.store.Append(e.ctx, tx, projector.TenantStream(tenant, "customer", customer), projector.AnyVersion,
			testevents.CustomerRegistered{Customer: customer, Name: name, Email: email, Plan: plan})
		return err
	})
	if err != nil {
		e.t.Fatal(err)
	}
}

// waitMsgs waits until the stream holds n messages and returns them.
func (e *personalEnv) waitMsgs(n int) []*jetstream.RawStreamMsg {
	e.t.Helper()
	var msgs []*jetstream.RawStreamMsg
	waitFor(e.t, "the relayed messages", 30*time.Second, func() bool { msgs = e.streamMsgs(e.nc); return len(msgs) >= n })
	if len(msgs) != n {
		e.t.Fatalf("%d messages, want %d", len(msgs), n)
	}
	return msgs
}

// TestRelaySendsNoPersonalFields: the relay publishes an event with
// personal fields with those fields null and the redaction header, so
// JetStream, which cannot forget, never holds them, clear or sealed; the
// other fields arrive intact and the message decodes.
func TestRelaySendsNoPersonalFields(t *testing.T) {
	t.Parallel()
	e := newPersonalEnv(t)
	for _, c := range []string{"c-1", "c-2"} {
		e.register("acme", c, "Ada "+c, c+"@example.com", "pro")
	}
	e.dispatcher(e.relay.Async())
	for _, m := range e.waitMsgs(2) {
		body := string(m.Data)
		if strings.Contains(body, "Ada") || strings.Contains(body, "@example.com") || strings.Contains(body, "pjx") {
			t.Fatalf("a JetStream message holds a personal field, clear or sealed: %s", body)
		}
		if !strings.Contains(body, `"plan": "pro"`) || m.Header.Get(pjs.HeaderPersonalRedacted) != "true" {
			t.Fatalf("message %s, headers %v", body, m.Header)
		}
		ev, err := pjs.Decode(e.personal.Registry, m.Header, m.Data)
		if err != nil {
			t.Fatal(err)
		}
		if c := ev.Payload.(testevents.CustomerRegistered); c.Name != "" || c.Email != "" || c.Plan != "pro" || c.Customer == "" {
			t.Fatalf("decoded %+v", c)
		}
	}
}

// TestRelayAroundForgetSendsNoPersonalFields: what docs/privacy.md says
// the relay sends, across a forget. Events relayed while the subject's key
// exists, events sealed before the forget but relayed after it, the
// subject.forgotten event, and appends for the forgotten subject: no
// message body or header holds any subject's personal value, in the clear
// or sealed; every personal type's message says it was redacted; the
// other fields, and the other subject's events, arrive intact.
func TestRelayAroundForgetSendsNoPersonalFields(t *testing.T) {
	t.Parallel()
	e := newPersonalEnv(t)
	// Every personal value holds "Secret".
	register := func(customer, n string) {
		e.register("acme", customer, "Secret Name "+customer+" "+n, "secret-"+customer+"-"+n+"@mail.example", "plan-"+customer+"-"+n)
	}
	register("c-1", "1")
	register("c-2", "1")
	d := e.dispatcher(e.relay.Async())
	e.waitMsgs(2)
	// Stop relaying, so the next events are read after the forget.
	sctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
	defer cancel()
	if err := d.Stop(sctx); err != nil {
		t.Fatal(err)
	}
	register("c-1", "2")
	register("c-2", "2")
	res, err := e.store.Forget(e.ctx, postgres.SubjectRef{Tenant: "acme", ID: "c-1"})
	if err != nil {
		t.Fatal(err)
	}
	register("c-1", "3")
	register("c-2", "3")
	e.dispatcher(e.relay.Async())
	msgs := e.waitMsgs(7)

	var plans []string
	forgotten := 0
	for _, m := range msgs {
		all := string(m.Data)
		for k, vs := range m.Header {
			all += "\n" + k + ": " + strings.Join(vs, ", ")
		}
		if strings.Contains(all, "Secret") || strings.Contains(all, "secret-") || strings.Contains(all, "pjx") {
			t.Fatalf("a JetStream message holds a personal field, clear or sealed: %s", all)
		}
		ev, err := pjs.Decode(e.personal.Registry, m.Header, m.Data)
		if err != nil {
			t.Fatal(err)
		}
		switch p := ev.Payload.(type) {
		case testevents.CustomerRegistered:
			if m.Header.Get(pjs.HeaderPersonalRedacted) != "true" || p.Name != "" || p.Email != "" {
				t.Fatalf("message %s, headers %v", m.Data, m.Header)
			}
			var fields map[string]json.RawMessage
			if err := json.Unmarshal(m.Data, &fields); err != nil || string(fields["name"]) != "null" || string(fields["email"]) != "null" {
				t.Fatalf("personal fields not sent as null: %s (%v)", m.Data, err)
			}
			plans = append(plans, p.Customer+":"+p.Plan)
		case projector.SubjectForgotten:
			if ev.ID != res.Event.ID || p.Subject != "c-1" || ev.Stream.Tenant != "acme" || m.Header.Get(pjs.HeaderPersonalRedacted) != "" {
				t.Fatalf("forgotten event %+v, want %s of c-1", ev, res.Event.ID)
			}
			forgotten++
		default:
			t.Fatalf("unexpected %s", ev.Type)
		}
	}
	// One message per event; the relay keeps each stream's order, not the
	// order across streams.
	slices.Sort(plans)
	want := "c-1:plan-c-1-1 c-1:plan-c-1-2 c-1:plan-c-1-3 c-2:plan-c-2-1 c-2:plan-c-2-2 c-2:plan-c-2-3"
	if got := strings.Join(plans, " "); got != want || forgotten != 1 {
		t.Fatalf("relayed %s and %d forgotten events, want %s and 1", got, forgotten, want)
	}
}

// TestRelayRedactsWhatTheStoreDeclares: a relay handed a registry that
// does not declare the personal fields (one built apart from the store's)
// still sends them as null: the store opened them with its own
// declaration, so the relay redacts by that one too.
func TestRelayRedactsWhatTheStoreDeclares(t *testing.T) {
	t.Parallel()
	e := newPersonalEnv(t)
	plain := projector.NewRegistry()
	projector.MustDefine[testevents.CustomerPlain](plain, "customer.registered")
	cfg := e.relayConfig()
	cfg.Registry, cfg.Name = plain, "plain-relay"
	r := e.env.relay(cfg)
	e.register("acme", "c-1", "Secret Name", "secret@mail.example", "pro")
	e.dispatcher(r.Async())
	for _, m := range e.waitMsgs(1) {
		if strings.Contains(string(m.Data), "ecret") || m.Header.Get(pjs.HeaderPersonalRedacted) != "true" {
			t.Fatalf("the relay sent the store's personal fields: %s, headers %v", m.Data, m.Header)
		}
		if !strings.Contains(string(m.Data), `"plan": "pro"`) {
			t.Fatalf("message %s", m.Data)
		}
	}
}
