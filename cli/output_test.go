package cli

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
)

// Stored data that would take over an operator's terminal: a title-setting
// OSC sequence, a colour, a C1 CSI, and 10,000 characters.
const (
	hostileName = "\x1b[31mred\x1b[0m"
	hostileText = "\x1b]0;owned\a\x1b[2J\u009b31m" + "boom"
)

var hostileLong = hostileText + strings.Repeat("x", 10_000)

// Every human-readable output of stored data shows it escaped and cut: no
// ESC, BEL or C1 control reaches the terminal, and no value is echoed
// whole past its limit. saga show once printed a key's ESC[31m raw,
// dead-letters show a handler error's title-setting sequence, and saga
// show and search verify echoed a 10,000-character argument whole.
func TestOutputOfStoredDataIsPrintable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	types := testevents.New()
	store := pgtest.Store(t, types.Registry)
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := store.Pool().Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	// A consumer shard that died with a hostile error, and one under a
	// hostile name (no projection can have it; a row can).
	exec(`INSERT INTO `+store.Table("projector_consumers")+` (name, instance_id, status, attempts, last_error, last_error_at)
		VALUES ('mailer', '__shared__', 'dead', 3, $1, now()), ($2, $3, 'idle', 0, NULL, NULL)`, hostileLong, hostileName, hostileText)
	// A saga instance: hostile tenant and key, a long state with a C1
	// control, a hostile last error, a timeout and a step.
	key := hostileText + strings.Repeat("k", 1000)
	inst := uuid.New()
	exec(`INSERT INTO `+store.Table("projector_saga_instances")+` (id, saga, tenant_id, key, correlation_id, status, state, last_error)
		VALUES ($1, 'sla', $2, $3, $1, 'failed', jsonb_build_object('note', $4::text), $4)`, inst, hostileName, key, hostileLong)
	exec(`INSERT INTO `+store.Table("projector_saga_timeouts")+` (id, instance_id, saga, name, due_at, attempts, last_error, scheduled_by)
		VALUES ($1, $2, 'sla', $3, now(), 2, $4, $1)`, uuid.New(), inst, hostileName, hostileLong)
	exec(`INSERT INTO `+store.Table("projector_saga_steps")+` (instance_id, step, cause_id, cause, type) VALUES ($1, 1, $2, 'event', $3)`,
		inst, uuid.New(), hostileName)
	// A dead letter of a real event appended with a hostile actor and
	// header, recorded with a hostile error; and one whose event is gone.
	var evID uuid.UUID
	var dlID int64
	err := pgx.BeginFunc(ctx, store.Pool(), func(tx pgx.Tx) error {
		mctx := projector.WithMetadata(ctx, projector.Metadata{Actor: hostileLong, Headers: map[string]string{"h": hostileText}})
		res, err := store.Append(mctx, tx, projector.Stream("ticket", "t-1"), projector.NoStream, testevents.TicketOpened{Title: hostileLong})
		if err != nil {
			return err
		}
		evID = res.Events[0].ID
		return tx.QueryRow(ctx, `INSERT INTO `+store.Table("projector_dead_letters")+` (consumer, instance_id, event_id, event_tx_id, event_seq,
			event_type, tenant_id, stream_type, stream_id, version, error, attempts, reason)
			SELECT $1, '__shared__', e.id, e.tx_id, e.seq, e.type, e.tenant_id, e.stream_type, e.stream_id, e.version, $2, 1, 'apply-error'
			FROM `+store.Table("projector_events")+` e WHERE e.id = $3 RETURNING id`, hostileName, hostileLong, evID).Scan(&dlID)
	})
	if err != nil {
		t.Fatal(err)
	}
	exec(`INSERT INTO `+store.Table("projector_dead_letters")+` (consumer, instance_id, event_id, event_tx_id, event_seq,
		event_type, tenant_id, stream_type, stream_id, version, error, attempts, reason)
		VALUES ($1, $2, $3, '1', 1, $1, $1, $1, $2, 1, $4, 1, 'apply-error')`, hostileName, hostileText, uuid.New(), hostileLong)

	for _, c := range []struct {
		name  string
		args  []string
		want  string // something the output must still say
		whole bool   // the command shows long values whole (tail's payloads)
	}{
		{"status", []string{"status"}, "dead", false},
		{"consumer list", []string{"consumer", "list"}, "dead", false},
		{"consumer status", []string{"consumer", "status", "mailer"}, "last error", false},
		{"consumer status of a hostile name", []string{"consumer", "status", hostileName}, "has shards for instances", false},
		{"saga list", []string{"saga", "list", "sla", "--status", "failed"}, "failed", false},
		{"saga show", []string{"saga", "show", "sla", key, "--tenant", hostileName}, "Pending timeouts", false},
		{"saga show of an unknown key", []string{"saga", "show", "sla", hostileLong, "--tenant", hostileLong}, "has no instance", false},
		{"dead-letters list", []string{"dead-letters", "list"}, "open", false},
		{"dead-letters show", []string{"dead-letters", "show", strconv.FormatInt(dlID, 10)}, "payload", false},
		{"dead-letters show of a pruned event", []string{"dead-letters", "show", strconv.FormatInt(dlID+1, 10)}, "event pruned", false},
		{"dead-letters retry of an unknown consumer", []string{"dead-letters", "retry", "--all", "--consumer", hostileLong}, "not found; registered consumers", false},
		{"search verify of an unknown name", []string{"search", "verify", hostileLong}, "no search projection", false},
		{"consumer restart of an unknown name", []string{"consumer", "restart", hostileLong}, "not found", false},
		{"events tail", []string{"events", "tail", "--from-start", "--limit", "1"}, "ticket.opened", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			out, code := runIn(t, store.Schema(), types.Registry, c.args...)
			if !strings.Contains(out, c.want) {
				t.Fatalf("exit %d, the output lacks %q:\n%.3000q", code, c.want, out)
			}
			if i := strings.IndexFunc(out, func(r rune) bool { return r == 0x1b || r == 0x07 || r == 0x9b }); i >= 0 {
				t.Fatalf("exit %d, a raw control character at byte %d reaches the terminal: %.200q", code, i, out[max(0, i-40):])
			}
			if !c.whole && strings.Contains(out, strings.Repeat("x", lineText+1)) || strings.Contains(out, strings.Repeat("k", 1000)) {
				t.Fatalf("exit %d, a long value is shown whole (%d bytes of output)", code, len(out))
			}
		})
	}
}
