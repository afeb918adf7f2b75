package cli

import (
	"strings"
	"testing"

	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/rebuild"
)

// rebuild NAME --in-place of a disabled consumer is refused with exit 3,
// naming `consumer enable`, before anything is cleared.
func TestRebuildInPlaceOfDisabledConsumerRefused(t *testing.T) {
	t.Parallel()
	e := newRebuildEnv(t, 3)
	e.run(nil, "consumer", "disable", "counter").want(t, ExitOK)
	e.run(nil, "rebuild", "counter", "--in-place", "--wait").want(t, ExitRefused, "consumer enable counter")
	if _, counted := e.versions(); counted != 6 {
		t.Fatalf("the refused rebuild left %d events counted, want 6", counted)
	}
	if rs, err := rebuild.List(e.ctx, e.store, ""); err != nil || len(rs) != 0 {
		t.Fatalf("the refused rebuild left rebuilds: %+v, %v", rs, err)
	}
}

// Every numeric flag of the rebuild commands (and repair's lock timeout)
// is range-checked: exit 2 with the flag named, never a driver error.
func TestRebuildNumericFlagsRangeChecked(t *testing.T) {
	t.Parallel()
	e := newRebuildEnv(t, 1)
	wired := []*projection.Async{e.counter(1)}
	for _, c := range []struct {
		args []string
		msg  string
	}{
		{[]string{"rebuild", "counter", "--version", "99999999999"}, "--version 99999999999"},
		{[]string{"rebuild", "counter", "--version", "2147483648"}, "--version 2147483648"},
		{[]string{"rebuild", "counter", "--version", "-1"}, "--version -1"},
		{[]string{"rebuild", "counter", "--version", "99999999999999999999999"}, "--version"},
		{[]string{"rebuild", "counter", "--pickup-timeout", "-1s"}, "--pickup-timeout"},
		{[]string{"rebuild", "counter", "--pickup-timeout", "25h"}, "--pickup-timeout"},
		{[]string{"rebuild", "counter", "--diff", "--limit", "0"}, "--limit 0"},
		{[]string{"rebuild", "counter", "--diff", "--limit", "99999999999"}, "--limit 99999999999"},
		{[]string{"rebuild", "diff", "counter", "--limit", "-5"}, "--limit -5"},
		{[]string{"rebuild", "counter", "--here", "--tenant", "a", "--partial-batch", "100001"}, "--partial-batch 100001"},
		{[]string{"rebuild", "counter", "--here", "--tenant", "a", "--partial-batch", "-1"}, "--partial-batch -1"},
		{[]string{"repair", "restored-cluster", "--lock-timeout", "0s"}, "--lock-timeout"},
		{[]string{"repair", "restored-cluster", "--lock-timeout", "1000h"}, "--lock-timeout"},
	} {
		r := e.run(wired, c.args...)
		if r.code != ExitUsage || !strings.Contains(r.errOut.String(), c.msg) {
			t.Errorf("%v: exit %d, want %d with %q\nstdout:\n%s\nstderr:\n%s", c.args, r.code, ExitUsage, c.msg, r.out.String(), r.errOut.String())
		}
	}
	if rs, err := rebuild.List(e.ctx, e.store, ""); err != nil || len(rs) != 0 {
		t.Fatalf("refused commands left rebuilds: %+v, %v", rs, err)
	}
}
