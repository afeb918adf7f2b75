package cli

import (
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/projection"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func TestParseAge(t *testing.T) {
	cases := []struct {
		in      string
		want    time.Duration
		wantErr bool
	}{
		{"30d", 30 * 24 * time.Hour, false},
		{"12h", 12 * time.Hour, false},
		{"90m", 90 * time.Minute, false},
		{"1ms", time.Millisecond, false},
		{"0d", 0, true},
		{"-5d", 0, true},
		{"-1h", 0, true},
		{"soon", 0, true},
		{"", 0, true},
		{"1.5d", 0, true},
		{"106751d", 106751 * 24 * time.Hour, false},
	}
	for _, c := range cases {
		got, err := parseAge(c.in)
		if (err != nil) != c.wantErr || got != c.want {
			t.Errorf("parseAge(%q) = %v, %v; want %v, error %v", c.in, got, err, c.want, c.wantErr)
		}
	}
}

// Ages that do not fit a time.Duration are refused, naming the limit: they
// once wrapped around (214897102651462d became about a second and pruned
// everything) or turned negative (106752d).
func TestParseAgeRefusesOverflow(t *testing.T) {
	for _, in := range []string{"106752d", "99999999d", "214897102651462d", "9223372036854775807d", "99999999999999999999d", "9999999999h", "2562048h"} {
		got, err := parseAge(in)
		if err == nil {
			t.Errorf("parseAge(%q) = %v, want an error", in, got)
			continue
		}
		if !strings.Contains(err.Error(), "106751d") {
			t.Errorf("parseAge(%q): %v: want the limit named", in, err)
		}
	}
}

// Connect never puts any part of a URL's user info in an error, whatever
// the URL looks like and wherever the failure happens (parse, dial, ping).
func TestConnectErrorHidesUserInfo(t *testing.T) {
	t.Parallel()
	for _, url := range []string{
		"postgres://u:S3cret@PW-hb@127.0.0.1:1/db",
		"postgresql://u:S3cret@PW-hb@127.0.0.1:99999999/db",
		"postgres://u:S3cret%40PW-hb@127.0.0.1:1/db?connect_timeout=1",
		"postgres://u:S3cret%40PW-hb@127.0.0.1:99999999/db",
		"postgres://u:S3cret%40PW-hb@[::1:1/db",
		"postgres://u:S3cret/PW-hb@127.0.0.1:1/db",
		"postgres://u:S3cret?PW-hb@127.0.0.1:1/db",
		"postgres://u:S3cret#PW-hb@127.0.0.1:1/db",
		"postgres://u:S3cret?PW-hb@127.0.0.1:99999/db",
		"postgres://127.0.0.1:99999/db?password=S3cret%40PW-hb",
		"host=127.0.0.1 port=1 user=u password=S3cret@PW-hb connect_timeout=1",
		"host=127.0.0.1 port=x user=u password='S3cret@PW-hb'",
		"host=127.0.0.1 port=x user=u password = 'S3cret @PW-hb' sslmode=bogus",
		// An escaped blank and an unterminated quote: pgx's own redaction
		// left the words after the first (a hostile-input audit).
		`host=127.0.0.1 password=S3cret\ PW-hb port=abc`,
		"host=127.0.0.1 password='S3cret PW-hb Words",
		"host=127.0.0.1 PASSWORD='x S3cret PW-hb",
	} {
		pool, err := Connect(t.Context(), url)
		if err == nil {
			pool.Close()
			t.Fatalf("%q: connected", url)
		}
		for _, secret := range []string{"S3cret", "PW-hb"} {
			if strings.Contains(err.Error(), secret) {
				t.Errorf("Connect(%q) error shows %q: %v", url, secret, err)
			}
		}
	}
	if _, err := Connect(t.Context(), "postgres://u:S3cret@PW-hb@127.0.0.1:1/db"); ExitCode(err) != ExitUsage {
		t.Errorf("an unescaped '@' in the user info: exit %d, want %d: %v", ExitCode(err), ExitUsage, err)
	}
}

func TestExitCode(t *testing.T) {
	cases := []struct {
		err  error
		want int
	}{
		{nil, ExitOK},
		{errors.New("boom"), ExitError},
		{usageError{errors.New("bad flag")}, ExitUsage},
		{fmt.Errorf("wrapped: %w", usageError{errors.New("x")}), ExitUsage},
		{errors.New(`unknown command "x" for "projector"`), ExitUsage},
		{errors.New(`required flag(s) "older-than" not set`), ExitUsage},
		{&projection.TransitionError{Op: "restart", From: projection.StatusIdle}, ExitRefused},
		{fmt.Errorf("op: %w", projector.ErrInvalidTransition), ExitRefused},
		{fmt.Errorf("consumer x: %w", projector.ErrNotFound), ExitError},
		// A port in use is a failure, not a bad command line.
		{usageError{fmt.Errorf("--http-addr: %w", &net.OpError{Op: "listen", Net: "tcp", Err: os.NewSyscallError("bind", syscall.EADDRINUSE)})}, ExitError},
	}
	for _, c := range cases {
		if got := ExitCode(c.err); got != c.want {
			t.Errorf("ExitCode(%v) = %d, want %d", c.err, got, c.want)
		}
	}
}

func TestCursorDisplay(t *testing.T) {
	if got := cursor(projector.Position{TxID: 9, Seq: math.MaxInt64}); got != "9/max" {
		t.Errorf("horizon cursor renders %q", got)
	}
	if got := cursor(projector.Position{TxID: 9, Seq: 4}); got != "9/4" {
		t.Errorf("event cursor renders %q", got)
	}
	if got := text("a  very\nlong   error message", 11); got != `"a very long"…(25 bytes)` {
		t.Errorf("text: %q", got)
	}
	if got := text("a  very\nshort\x1b[2J", 40); got != `"a very short\x1b[2J"` {
		t.Errorf("text: %q", got)
	}
}

// A missing positional argument is named, with the usage line, and is a
// usage error: it used to say only "accepts 1 arg(s), received 0".
func TestMissingArgumentIsNamed(t *testing.T) {
	cmd := &cobra.Command{Use: "skip NAME", Args: exactArgs(1), RunE: func(*cobra.Command, []string) error { return nil }}
	cmd.SetArgs([]string{}) // not nil: cobra would read the test binary's own arguments
	cmd.SetOut(io.Discard)
	cmd.SetErr(io.Discard)
	err := cmd.Execute()
	if ExitCode(err) != ExitUsage || err == nil || !strings.Contains(err.Error(), "missing NAME") || !strings.Contains(err.Error(), "skip NAME") {
		t.Fatalf("missing argument: exit %d, %v", ExitCode(err), err)
	}
	cmd.SetArgs([]string{"a", "b"})
	if err := cmd.Execute(); ExitCode(err) != ExitUsage {
		t.Fatalf("extra argument: exit %d, %v", ExitCode(err), err)
	}
}

// Run takes its environment from Config.Getenv, not the process's: the
// schema and database URL it is given there are the ones the command uses,
// and a failure is printed as Main prints it, on the stderr it was given.
func TestRunReadsConfigGetenv(t *testing.T) {
	t.Parallel()
	env := map[string]string{EnvSchema: "Robert'); DROP", EnvDatabaseURL: "postgres://127.0.0.1:1/x"}
	var out, errOut strings.Builder
	code := Run(t.Context(), Config{Getenv: func(k string) string { return env[k] }}, []string{"migrate", "status"}, &out, &errOut)
	if code != ExitUsage || !strings.HasPrefix(errOut.String(), "projector: --schema: ") || strings.Count(errOut.String(), "\n") != 1 || out.Len() != 0 {
		t.Fatalf("exit %d, stdout %q, stderr %q: want exit 2 and one line on the bad schema from Getenv", code, out.String(), errOut.String())
	}
}
