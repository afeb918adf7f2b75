package jetstream_test

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/projectorhq/projector/cli"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	pjs "github.com/projectorhq/projector/stores/jetstream"
)

// `projector relay status` shows the stream's state beside the relay's
// shard, as a table or JSON; a bad -o is a usage error (exit 2).
func TestRelayStatusCommand(t *testing.T) {
	e := newEnv(t)
	r := e.relay(e.relayConfig())
	d := e.dispatcher(r.Async())
	for i := range 7 {
		e.append("acme", "st", testevents.TicketCommented{Body: "s", N: i})
	}
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	if err := d.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) (string, error) {
		root := cli.New(cli.Config{Registry: e.types.Registry})
		var out bytes.Buffer
		root.SetArgs(append([]string{"relay", "status", "--nats-url", e.url, "--stream", e.stream,
			"--database-url", pgtest.URL(t), "--schema", e.store.Schema()}, args...))
		root.SetOut(&out)
		root.SetErr(&out)
		err := root.ExecuteContext(ctx)
		return out.String(), err
	}
	out, err := run("-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var st pjs.Status
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if st.Messages != 7 || st.LastSeq != 7 || st.DuplicateWindow != pjs.DefaultDuplicateWindow || st.Relay == nil || st.Relay.Consumer != "jetstream_relay" || st.Relay.LagEvents != 0 {
		t.Fatalf("status %+v", st)
	}
	out, err = run()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"STREAM " + e.stream, "messages          7", "duplicate window  5m0s", "RELAY jetstream_relay", "lag               0 events"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	if _, err := run("-o", "yaml"); cli.ExitCode(err) != cli.ExitUsage {
		t.Fatalf("-o yaml: exit %d, %v", cli.ExitCode(err), err)
	}
}
