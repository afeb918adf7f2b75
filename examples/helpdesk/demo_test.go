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
	err := helpdesk.RunDemo(context.Background(), pgtest.Pool(t), &out, helpdesk.DemoConfig{Schema: schema, Users: 4, Actions: 60})
	if err != nil {
		t.Fatalf("demo: %v\n%s", err, out.String())
	}
	for _, want := range []string{"consumers caught up", "== Agent workload", "alice", "== Customer history", "== Welcome mails", "to ada <ada@example.com>", "live_counter", "T-0001 as of v1", "deleted"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("demo output lacks %q:\n%s", want, out.String())
		}
	}
}
