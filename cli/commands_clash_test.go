package cli

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// An application command named as one of Projector's is refused, not
// mounted beside it: cobra ran one of the two for the name, and a
// newcomer's own `search` hid `search verify`, which then printed the
// application's output with exit 0. Aliases count, as do cobra's help and
// completion; a name of the application's own is mounted.
func TestApplicationCommandsMayNotShadowProjectors(t *testing.T) {
	t.Parallel()
	for _, c := range []*cobra.Command{
		{Use: "search TEXT"},
		{Use: "find", Aliases: []string{"status"}},
		{Use: "help"},
	} {
		var stderr bytes.Buffer
		code := Run(context.Background(), Config{Commands: []*cobra.Command{c}}, []string{"version"}, &bytes.Buffer{}, &stderr)
		if code != ExitUsage || !strings.Contains(stderr.String(), "cli.Config.Commands") || !strings.Contains(stderr.String(), "give yours another name") {
			t.Errorf("%q (aliases %v): exit %d, want %d:\n%s", c.Use, c.Aliases, code, ExitUsage, stderr.String())
		}
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("New mounted %q beside Projector's command", c.Use)
				}
			}()
			New(Config{Commands: []*cobra.Command{c}})
		}()
	}
	ran := false
	own := &cobra.Command{Use: "find", RunE: func(*cobra.Command, []string) error { ran = true; return nil }}
	if code := Run(context.Background(), Config{Commands: []*cobra.Command{own}}, []string{"find"}, &bytes.Buffer{}, &bytes.Buffer{}); code != ExitOK || !ran {
		t.Fatalf("an application's own command: exit %d, ran %v", code, ran)
	}
}
