package cli

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// Every command group refuses an unknown subcommand with the usage exit
// code, as an operator's script expects: `search bogus` once printed help
// and exited 0. The groups are found by walking the tree, so a group added
// later is checked too; a command that takes arguments of its own beside
// its subcommands (`rebuild NAME`) is not a group.
func TestEveryGroupRefusesAnUnknownSubcommand(t *testing.T) {
	t.Parallel()
	var groups [][]string
	var walk func(c *cobra.Command, path []string)
	walk = func(c *cobra.Command, path []string) {
		if c.HasSubCommands() && len(strings.Fields(c.Use)) == 1 {
			groups = append(groups, path)
		}
		for _, sub := range c.Commands() {
			walk(sub, append(path[:len(path):len(path)], sub.Name()))
		}
	}
	walk(New(Config{}), nil)
	if len(groups) < 6 || !slices.ContainsFunc(groups, func(p []string) bool { return slices.Equal(p, []string{"search"}) }) {
		t.Fatalf("found only %d command groups: %v", len(groups), groups)
	}
	for _, path := range groups {
		t.Run(strings.Join(append([]string{"root"}, path...), "_"), func(t *testing.T) {
			root := New(Config{})
			var out bytes.Buffer
			root.SetOut(&out)
			root.SetErr(&out)
			root.SetArgs(append(path[:len(path):len(path)], "bogus"))
			err := root.ExecuteContext(context.Background())
			if code := ExitCode(err); code != ExitUsage {
				t.Fatalf("%v bogus: exit %d, want %d (%v)\n%s", path, code, ExitUsage, err, out.String())
			}
			if !strings.Contains(err.Error(), "bogus") {
				t.Fatalf("%v bogus: the error does not name the subcommand: %v", path, err)
			}
		})
	}
}
