package clientcheck_test

import (
	"testing"

	"github.com/projectorhq/projector/internal/clientcheck"
)

func TestServerMajor(t *testing.T) {
	for v, want := range map[string]int{"15.20 (Debian 15.20-0+deb12u1)": 15, "13.4": 13, "17beta1": 17, "14devel": 14, "": 0, "x": 0, "9.6.24": 9} {
		if got := clientcheck.ServerMajor(v); got != want {
			t.Errorf("ServerMajor(%q) = %d, want %d", v, got, want)
		}
	}
}
