package cli

import (
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/projection"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

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
	}
	for _, c := range cases {
		got, err := parseAge(c.in)
		if (err != nil) != c.wantErr || got != c.want {
			t.Errorf("parseAge(%q) = %v, %v; want %v, error %v", c.in, got, err, c.want, c.wantErr)
		}
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
	if got := shorten("a  very\nlong   error message", 12); got != "a very long…" {
		t.Errorf("shorten: %q", got)
	}
}
