package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/stores/jetstream"
	"github.com/projectorhq/projector/stores/postgres"
)

// park writes, as the claims consumer does under ParkStream, a park of
// subscription for streamID holding n new events of the log, and returns
// its id and the events.
func (e *relayEnv) park(subscription, streamID string, n int) (int64, []projector.Event) {
	e.t.Helper()
	var evs []projector.Event
	var id int64
	err := pgx.BeginFunc(e.ctx, e.store.Pool(), func(tx pgx.Tx) error {
		payloads := make([]any, n)
		for i := range payloads {
			payloads[i] = testevents.TicketCommented{Body: "parked", N: i}
		}
		ref := projector.TenantStream("acme", "ticket", streamID)
		res, err := e.store.Append(e.ctx, tx, ref, projector.AnyVersion, payloads...)
		if err != nil {
			return err
		}
		evs = res.Events
		if _, err := tx.Exec(e.ctx, `INSERT INTO `+e.store.Table("projector_jetstream_streams")+` (subscription, tenant_id, stream_type, stream_id, last_version)
			VALUES ($1, 'acme', 'ticket', $2, $3)`, subscription, streamID, evs[n-1].Version); err != nil {
			return err
		}
		if err := tx.QueryRow(e.ctx, `INSERT INTO `+e.store.Table("projector_jetstream_parks")+` (subscription, tenant_id, stream_type, stream_id, event_id, event_type, version, error, failures)
			VALUES ($1, 'acme', 'ticket', $2, $3, $4, $5, 'boom', 5) RETURNING id`, subscription, streamID, evs[0].ID, evs[0].Type, evs[0].Version).Scan(&id); err != nil {
			return err
		}
		for _, ev := range evs {
			msg, err := jetstream.NewMsg("projector", ev)
			if err != nil {
				return err
			}
			headers, err := json.Marshal(msg.Header)
			if err != nil {
				return err
			}
			if _, err := tx.Exec(e.ctx, `INSERT INTO `+e.store.Table("projector_jetstream_parked_messages")+` (park_id, version, event_id, subject, headers, data)
				VALUES ($1, $2, $3, $4, $5, $6)`, id, ev.Version, ev.ID, msg.Subject, headers, msg.Data); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		e.t.Fatal(err)
	}
	return id, evs
}

// The park commands of the claims consumer: list and show from any binary,
// retry only from one that wires the consumer (the whole sequence applied
// through its handler, once; a failing handler exits 1 and keeps the
// park), discard without the handler, recorded with who and how many. A
// second retry or discard is refused (exit 3); bad ids, limits, statuses,
// names and operators exit 2.
func TestRelayParkedCommands(t *testing.T) {
	t.Parallel()
	e := newRelayEnv(t)
	effects := e.store.Table("cli_parked_effects")
	e.exec(`CREATE TABLE ` + effects + ` (event_id uuid NOT NULL, version bigint NOT NULL, n bigserial)`)
	var broken atomic.Bool
	broken.Store(true)
	wired := Config{JetStreamConsumers: func(store *postgres.Store) ([]*jetstream.Consumer, error) {
		c, err := jetstream.NewConsumer(jetstream.ConsumerConfig{Store: store, Subscription: "feed", ErrorMode: jetstream.ParkStream,
			Handler: func(ctx context.Context, tx pgx.Tx, ev projector.Event) error {
				if broken.Load() {
					return errors.New("still broken")
				}
				_, err := tx.Exec(ctx, `INSERT INTO `+effects+` (event_id, version) VALUES ($1, $2)`, ev.ID, ev.Version)
				return err
			}})
		return []*jetstream.Consumer{c}, err
	}}
	id1, evs1 := e.park("feed", "t1", 3)
	id2, _ := e.park("feed", "t2", 2)
	e.park("other", "t3", 1)

	out, code := e.run(Config{}, "relay", "parked", "list", "--subscription", "feed")
	if code != ExitOK || strings.Count(out, "\n") != 3 || !strings.Contains(out, "ticket/t1 (tenant acme)") || !strings.Contains(out, "MESSAGES") {
		t.Fatalf("list: exit %d:\n%s", code, out)
	}
	out, code = e.run(Config{}, "relay", "parked", "list", "--subscription", "feed", "-o", "json", "--limit", "1")
	var listed []jetstream.Park
	if err := json.Unmarshal([]byte(out), &listed); code != ExitOK || err != nil || len(listed) != 1 || listed[0].ID != id1 ||
		listed[0].Messages != 3 || listed[0].Status != "parked" || listed[0].StreamID != "t1" {
		t.Fatalf("list -o json: exit %d, %v: %s", code, err, out)
	}
	out, code = e.run(Config{}, "relay", "parked", "show", fmt.Sprint(id1), "--subscription", "feed")
	if code != ExitOK || !strings.Contains(out, "sequence:   3 messages") || !strings.Contains(out, evs1[2].ID.String()) || !strings.Contains(out, `"body":"parked"`) {
		t.Fatalf("show: exit %d:\n%s", code, out)
	}
	if _, code := e.run(Config{}, "relay", "parked", "show", fmt.Sprint(id1), "--subscription", "other"); code != ExitError {
		t.Fatalf("show of another subscription's park: exit %d, want %d", code, ExitError)
	}
	for _, bad := range [][]string{
		{"list", "--subscription", "feed", "--limit", "0"},
		{"list", "--subscription", "feed", "--limit", "10001"},
		{"list"},
		{"list", "--subscription", "feed.x"},
		{"list", "--subscription", "fe\x00ed"},
		{"list", "--subscription", "feed", "--status", "open"},
		{"list", "--subscription", "feed", "--status", ""},
		{"list", "--subscription", "feed", "--after", "-1"},
		{"show", "0", "--subscription", "feed"},
		{"show", "x", "--subscription", "feed"},
		{"show", "1", "2", "--subscription", "feed"},
		{"discard", "--subscription", "feed"},
		{"discard", "1", "--subscription", "fe ed"},
		{"discard", fmt.Sprint(id2), "--subscription", "feed", "--by", "ops\x1b[2J"},
		{"retry", fmt.Sprint(id1), "--subscription", "feed"}, // no consumer wired
	} {
		out, code := e.run(Config{}, append([]string{"relay", "parked"}, bad...)...)
		if code != ExitUsage {
			t.Fatalf("%q: exit %d, want %d: %s", bad, code, ExitUsage, out)
		}
	}
	if out, code := e.run(wired, "relay", "parked", "retry", fmt.Sprint(id1), "--subscription", "other"); code != ExitUsage || !strings.Contains(out, "JetStreamConsumers") {
		t.Fatalf("retry of an unwired subscription: exit %d: %s", code, out)
	}

	out, code = e.run(wired, "relay", "parked", "retry", fmt.Sprint(id1), "--subscription", "feed", "--by", "alice")
	if code != ExitError || !strings.Contains(out, "still broken") || e.count(`SELECT count(*) FROM `+effects) != 0 {
		t.Fatalf("failing retry: exit %d: %s", code, out)
	}
	broken.Store(false)
	out, code = e.run(wired, "relay", "parked", "retry", fmt.Sprint(id1), "--subscription", "feed", "--by", "alice")
	if code != ExitOK || !strings.Contains(out, "applied its 3 messages in order and resolved") {
		t.Fatalf("retry: exit %d: %s", code, out)
	}
	for i, ev := range evs1 {
		if n := e.count(`SELECT count(*) FROM `+effects+` WHERE event_id = $1 AND n = (SELECT min(n) FROM `+effects+`) + $2`, ev.ID, i); n != 1 {
			t.Fatalf("v%d applied %d times at its place", ev.Version, n)
		}
	}
	if out, code := e.run(wired, "relay", "parked", "retry", fmt.Sprint(id1), "--subscription", "feed"); code != ExitRefused || !strings.Contains(out, "resolved already") {
		t.Fatalf("second retry: exit %d: %s", code, out)
	}
	out, code = e.run(Config{}, "relay", "parked", "discard", fmt.Sprint(id2), "--subscription", "feed", "--by", "bob")
	if code != ExitOK || !strings.Contains(out, "discarded 2 messages of ticket/t2 (tenant acme) (recorded as discarded by bob)") {
		t.Fatalf("discard: exit %d: %s", code, out)
	}
	if out, code := e.run(Config{}, "relay", "parked", "discard", fmt.Sprint(id2), "--subscription", "feed"); code != ExitRefused || !strings.Contains(out, "discarded already") {
		t.Fatalf("second discard: exit %d: %s", code, out)
	}
	if out, code := e.run(wired, "relay", "parked", "retry", fmt.Sprint(id2), "--subscription", "feed"); code != ExitRefused {
		t.Fatalf("retry after a discard: exit %d: %s", code, out)
	}
	if out, code := e.run(Config{}, "relay", "parked", "list", "--subscription", "feed"); code != ExitOK || !strings.Contains(out, "no parks of feed match") {
		t.Fatalf("list after: exit %d: %s", code, out)
	}
	out, code = e.run(Config{}, "relay", "parked", "list", "--subscription", "feed", "--status", "all")
	if code != ExitOK || !regexp.MustCompile(`\n`+fmt.Sprint(id1)+` .* resolved `).MatchString(out) || !regexp.MustCompile(`\n`+fmt.Sprint(id2)+` .* discarded `).MatchString(out) {
		t.Fatalf("list --status all: exit %d:\n%s", code, out)
	}
	out, code = e.run(Config{}, "relay", "parked", "show", fmt.Sprint(id2), "--subscription", "feed")
	if code != ExitOK || !strings.Contains(out, "by bob: its 2 messages were dropped, never applied") ||
		!strings.Contains(out, "last error: ") || strings.Contains(out, "\nerror:") {
		t.Fatalf("show of the discarded park: exit %d:\n%s", code, out)
	}
}
