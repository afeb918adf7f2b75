// Package browsertest finds a headless browser for the tests that drive the
// console and the live feed in one (chromedp).
package browsertest

import (
	"os"
	"os/exec"
	"testing"
)

// EnvChromium names the browser binary to use instead of looking on the
// PATH.
const EnvChromium = "PROJECTOR_CHROMIUM"

// Chromium finds the browser: $PROJECTOR_CHROMIUM, else chromium,
// chromium-browser or google-chrome on the PATH. Without one the test is
// skipped, but under CI=true it fails: CI installs Debian's chromium
// (.ci/run).
func Chromium(t testing.TB) string {
	t.Helper()
	if p := os.Getenv(EnvChromium); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("browser test: no chromium on the PATH; CI must install it (apt-get install -y chromium, as .ci/run does)")
	}
	t.Skip("browser test skipped: no chromium on the PATH (apt-get install -y chromium, or set " + EnvChromium + ")")
	return ""
}
