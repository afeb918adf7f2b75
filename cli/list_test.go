package cli

import (
	"bytes"
	"context"
	"testing"
)

// TestListAndShowUsage: the list and show commands of parks and dead
// letters (the dispatcher's and the JetStream claims consumer's) are built
// by one builder each, and check their shared flags alike and in the same
// order, as usage errors (exit 2) before any connection is made, in the
// words they always had; a value is named once, quoted once, even an
// unprintable one (escaped inside its one pair of quotes).
func TestListAndShowUsage(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"parked", "list", "--limit", "0"}, "--limit 0: want 1 to 10000"},
		{[]string{"parked", "list", "--after", "-1"}, "--after -1: want an id (0 for the start)"},
		{[]string{"parked", "list", "--status", "open"}, `--status "open": want parked, resolved, discarded or all`},
		{[]string{"parked", "list", "-o", "x", "--limit", "0"}, `--output "x": want table or json`},
		{[]string{"parked", "list", "x"}, `unknown command "x" for "projector parked list"`},
		{[]string{"relay", "parked", "list", "--subscription", "feed", "--limit", "10001"}, "--limit 10001: want 1 to 10000"},
		{[]string{"relay", "parked", "list", "--subscription", "feed", "--status", ""}, `--status "": want parked, resolved, discarded or all`},
		{[]string{"relay", "parked", "list", "--status", "all"}, `--subscription: jetstream: invalid configuration: subscription "": want 1..128 ASCII letters, digits, '-' or '_'`},
		{[]string{"relay", "dead-letters", "list", "--subscription", "feed", "--after", "-2"}, "--after -2: want an id (0 for the start)"},
		{[]string{"relay", "dead-letters", "list", "--subscription", "feed", "--status", "parked"}, `--status "parked": want open, resolved, discarded or all`},
		{[]string{"relay", "dead-letters", "list", "--subscription", "fe.ed", "--limit", "0"}, "--limit 0: want 1 to 10000"},
		{[]string{"dead-letters", "list", "--status", "parked"}, `--status "parked": want open, resolved, discarded or all`},
		{[]string{"dead-letters", "list", "--status", "all", "--reason", "x"}, `--reason "x": want apply-error or skipped`},
		{[]string{"parked", "show", "0"}, `park id "0": want a positive integer`},
		{[]string{"parked", "show", "x", "-o", "yaml"}, `--output "yaml": want table or json`},
		{[]string{"relay", "parked", "show", "1"}, `--subscription: jetstream: invalid configuration: subscription "": want 1..128 ASCII letters, digits, '-' or '_'`},
		{[]string{"relay", "dead-letters", "show", "x", "--subscription", "feed"}, `dead-letter id "x": want a positive integer`},
		{[]string{"dead-letters", "show", "1", "2"}, "want one dead-letter id, got 2 arguments"},
		{[]string{"dead-letters", "show", "-5"}, "unknown shorthand flag: '5' in -5"},
		{[]string{"parked", "list", "--status", "bad\x00"}, `--status "bad\x00": want parked, resolved, discarded or all`},
		{[]string{"dead-letters", "list", "--status", "x\ny"}, `--status "x\ny": want open, resolved, discarded or all`},
		{[]string{"parked", "show", "\x1b[2J"}, `park id "\x1b[2J": want a positive integer`},
		{[]string{"relay", "parked", "list", "--subscription", "fe\x00ed"}, `--subscription: jetstream: invalid configuration: subscription "fe\x00ed": want 1..128 ASCII letters, digits, '-' or '_'`},
	} {
		root := New(Config{})
		root.SetArgs(append(c.args, "--database-url", "postgres://nowhere.invalid/x"))
		var out bytes.Buffer
		root.SetOut(&out)
		root.SetErr(&out)
		err := root.ExecuteContext(context.Background())
		if code := ExitCode(err); code != ExitUsage || err.Error() != c.want {
			t.Errorf("%q: exit %d, %v; want exit %d, %q", c.args, code, err, ExitUsage, c.want)
		}
	}
}
