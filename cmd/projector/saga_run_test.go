package main_test

import (
	"context"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/examples/helpdesk"
)

// `projector run` with the example wired runs the helpdesk's SLA saga: its
// consumer starts an instance for a high-priority ticket with a reminder and
// an escalation pending, and the saga runner started beside the dispatcher
// fires them once they are due (moved into the past here, as four hours
// passing would), appending the reminder comment and the escalation to the
// ticket's stream through the ticket aggregate, each once, and counting
// them in /metrics. SIGTERM stops the runner with the dispatcher, cleanly.
func TestRunFiresSagaTimeouts(t *testing.T) {
	t.Parallel()
	o := newOpsEnv(t)
	if _, err := helpdesk.DefineSLA(o.store.Registry()); err != nil {
		t.Fatal(err)
	}
	o.append(projector.Stream(helpdesk.TicketStream, "T-9"), helpdesk.TicketOpened{Customer: "ada", Subject: "printer on fire"})
	cmd, addr, out := o.startRun()
	ctx := context.Background()
	timeouts, instances := o.store.Table("projector_saga_timeouts"), o.store.Table("projector_saga_instances")
	poll(t, "the SLA saga to schedule T-9's timeouts", func() bool {
		var n int
		must(t, o.store.Pool().QueryRow(ctx, `SELECT count(*) FROM `+timeouts+` t JOIN `+instances+` i ON i.id = t.instance_id
			WHERE i.saga = $1 AND i.key = 'T-9' AND t.due_at > now() + interval '1 hour'`, helpdesk.SLAName).Scan(&n))
		return n == 2
	})
	// T-1 was opened, assigned and closed: its instance completed at once.
	var status string
	must(t, o.store.Pool().QueryRow(ctx, `SELECT status FROM `+instances+` WHERE saga = $1 AND key = 'T-1'`, helpdesk.SLAName).Scan(&status))
	if status != "completed" {
		t.Fatalf("T-1's SLA instance is %s, want completed", status)
	}
	if _, err := o.store.Pool().Exec(ctx, `UPDATE `+timeouts+` SET due_at = now() - interval '1 second'`); err != nil {
		t.Fatal(err)
	}
	poll(t, "the escalation of T-9", func() bool {
		must(t, o.store.Pool().QueryRow(ctx, `SELECT status FROM `+instances+` WHERE saga = $1 AND key = 'T-9'`, helpdesk.SLAName).Scan(&status))
		return status == "completed"
	})
	var types []string
	rows, err := o.store.Pool().Query(ctx, `SELECT type FROM `+o.store.Table("projector_events")+` WHERE stream_type = $1 AND stream_id = 'T-9' ORDER BY version`, helpdesk.TicketStream)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var typ string
		must(t, rows.Scan(&typ))
		types = append(types, typ)
	}
	must(t, rows.Err())
	if strings.Join(types, ",") != "ticket.opened,ticket.commented,ticket.escalated" {
		t.Fatalf("T-9's stream: %v, want the reminder comment and the escalation once each after the opening", types)
	}
	var pending int
	must(t, o.store.Pool().QueryRow(ctx, `SELECT count(*) FROM `+timeouts).Scan(&pending))
	if pending != 0 {
		t.Fatalf("%d timeouts still pending after they fired", pending)
	}
	_, metrics := get(t, "http://"+addr+"/metrics")
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`(?m)^projector_saga_timeouts_fired_total\{saga="ticket_sla"\} 2$`),
		regexp.MustCompile(`(?m)^projector_saga_timeout_lateness_seconds_count\{saga="ticket_sla"\} 2$`),
		// T-1 ("printer": normal priority) completed when opened; its
		// assignment and closing reached a completed instance.
		regexp.MustCompile(`(?m)^projector_saga_late_events_total\{saga="ticket_sla"\} 2$`),
		regexp.MustCompile(`(?m)^projector_saga_events_ignored_total\{saga="ticket_sla"\} 0$`),
		regexp.MustCompile(`(?m)^projector_events_processed_total\{consumer="ticket_sla",instance_id="__shared__"\} \d+$`),
	} {
		if !want.MatchString(metrics) {
			t.Errorf("metrics lack %s:\n%s", want, grepLines(metrics, "saga"))
		}
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("run after SIGTERM: %v\n%s", err, out)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// poll waits up to a minute for cond, checking every 20 ms.
func poll(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func grepLines(s, sub string) string {
	var keep []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "\n")
}
