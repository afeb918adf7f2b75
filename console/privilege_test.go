package console_test

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/projectorhq/projector/console"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/stores/postgres"
)

// A console whose database role may only read (an operator's read-only
// role, docs/operations.md "Roles and privileges") answers an action
// PostgreSQL refuses with 403 saying so, not 500 with the driver's error
// (a least-privilege deployment drill), and changes nothing.
func TestActionRefusedByTheDatabaseRole(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, options{token: testToken, extra: func(cfg *console.Config) {
		schema := cfg.Store.Schema()
		role := pgtest.ReaderRole(t, schema)
		ro, err := postgres.New(ctx, pgtest.PoolAs(t, role, false, 4), postgres.Config{Schema: schema, Registry: cfg.Store.Registry()})
		if err != nil {
			t.Fatal(err)
		}
		cfg.Store = ro
	}})
	stop := e.dispatch()
	defer stop()
	e.appendEvents("a", 1)
	c := e.client()
	if code, _ := c.do(http.MethodGet, "/state.json", nil, nil); code != http.StatusOK {
		t.Fatalf("state.json through the read-only role: %d", code)
	}
	csrf := c.login("olga")
	code, body := c.do(http.MethodPost, "/actions/consumer/disable", url.Values{"consumer": {"tickets"}, "csrf": {csrf}}, nil)
	if code != http.StatusForbidden || !strings.Contains(body, "may not do this") || !strings.Contains(body, "Roles and privileges") {
		t.Fatalf("disable through a read-only database role: %d, want 403 saying so:\n%s", code, body)
	}
	if st := e.status(); st.Status == "disabled" {
		t.Fatal("the refused action disabled the consumer")
	}
	// Its logout cannot be written for the other console processes: it
	// ends the session here and says so.
	if code, _ := c.do(http.MethodPost, "/logout", url.Values{"csrf": {csrf}}, nil); code != http.StatusSeeOther {
		t.Fatalf("logout through a read-only database role: %d", code)
	}
	if !strings.Contains(e.logs.String(), "logout recorded in this process only") {
		t.Error("a logout the role could not share did not say so")
	}
	if code, _ := c.do(http.MethodPost, "/actions/consumer/disable", url.Values{"consumer": {"tickets"}, "csrf": {csrf}}, nil); code != http.StatusUnauthorized {
		t.Errorf("an action after the logout: %d, want 401", code)
	}
}
