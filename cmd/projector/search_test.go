package main_test

import (
	"context"
	"strings"
	"testing"
	"time"
)

// With PROJECTOR_EXAMPLE=1, `run` creates the ticket search table and keeps
// it up to date as the consumer ticket_search (PostgreSQL full-text search),
// and `search verify` compares it with the log through the same binary's
// wiring: zero differences once caught up (exit 0), and a planted document
// is reported as extra (exit 1). Without the wiring, verify would exit 2
// ("no search projection"); without Setup, the table would not exist.
func TestRunIndexesTicketSearchAndVerifyChecksIt(t *testing.T) {
	t.Parallel()
	o := newOpsEnv(t)
	r := run(t, o.env, "search", "verify", "nobody")
	wantError(t, r, 2, `no search projection "nobody" (this binary wires ticket_search)`)

	cmd, _, _ := o.startRun()
	deadline := time.Now().Add(time.Minute)
	for {
		r = run(t, o.env, "status", "-o", "json")
		var shards []struct {
			Consumer  string `json:"consumer"`
			Status    string `json:"status"`
			LagEvents int64  `json:"lag_events"`
		}
		if r.code != 0 {
			t.Fatalf("status -o json: %+v", r)
		}
		if err := unmarshalStatusShards(r.stdout, &shards); err != nil {
			t.Fatalf("status -o json is not JSON: %v\n%s", err, r.stdout)
		}
		caught := false
		for _, s := range shards {
			if s.Consumer == "ticket_search" {
				caught = s.LagEvents == 0 && s.Status == "idle"
			}
		}
		if caught {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("ticket_search did not catch up: %s", r.stdout)
		}
		time.Sleep(20 * time.Millisecond) // polling another process's progress
	}
	// The index holds T-1 as its three events left it.
	var doc string
	if err := o.store.Pool().QueryRow(context.Background(), `SELECT doc::text FROM `+o.store.Table("projector_search_tickets")+` WHERE id = 'T-1'`).Scan(&doc); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"status": "closed"`, `"agent": "alice"`, `"resolution": "fixed"`, `"subject": "printer"`} {
		if !strings.Contains(doc, want) {
			t.Errorf("indexed T-1 %s lacks %s", doc, want)
		}
	}

	r = run(t, o.env, "search", "verify", "ticket_search")
	if r.code != 0 || !strings.Contains(r.stdout, "1 documents expected, 1 indexed, 1 compared") || !strings.Contains(r.stdout, "the index holds what the log says") {
		t.Fatalf("verify of a caught-up index: %+v", r)
	}
	if _, err := o.store.Pool().Exec(context.Background(), `INSERT INTO `+o.store.Table("projector_search_tickets")+` (tenant_id, id, doc)
		VALUES ('__system__', 'planted', '{"id": "planted", "subject": "not in the log"}')`); err != nil {
		t.Fatal(err)
	}
	r = run(t, o.env, "search", "verify", "ticket_search")
	if r.code != 1 || !strings.Contains(r.stdout, "extra    __system__/planted") || !strings.Contains(r.stderr, "0 missing, 1 extra") {
		t.Fatalf("verify with a planted document: %+v", r)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
}
