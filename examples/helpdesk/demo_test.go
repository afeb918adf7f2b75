package helpdesk_test

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/projectorhq/projector/examples/helpdesk"
	"github.com/projectorhq/projector/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func TestRunDemo(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	schema := pgtest.Schema(t) // reserved name, dropped at the end; the demo resets it
	err := helpdesk.RunDemo(context.Background(), pgtest.Pool(t), &out, helpdesk.DemoConfig{Schema: schema, Tickets: 40, Users: 4})
	if err != nil {
		t.Fatalf("demo: %v\n%s", err, out.String())
	}
	for _, want := range []string{"read back", "ticket.opened        40", "stream ticket/T-0001:", "v1  ticket.opened"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("demo output lacks %q:\n%s", want, out.String())
		}
	}
}
