package cli

import (
	"strings"
	"testing"
)

// natsURLSecrets are the parts of the URLs below that must never be
// printed: passwords, tokens, and the fragment a parse error would quote.
var natsURLSecrets = []string{"S3cret", "PW-hb", "PWhb", "%zz"}

var leakyNATSURLs = []string{
	"nats://u:S3cret%zz@127.0.0.1:4222",
	"nats://u:S3cretPWhb@127.0.0.1:1",
	"nats://S3cretPWhb@127.0.0.1:1",
	"nats://u:S3cret%40PW-hb@127.0.0.1:1",
	"nats://u:S3cret@PW-hb@127.0.0.1:1",
	"nats://u:pw@127.0.0.1:1, nats://u:S3cretPWhb@[::1",
	"tls://u:S3cretPWhb@127.0.0.1:99999",
	"u:S3cret%zzPWhb@127.0.0.1:1",
}

// ConnectNATS never puts a URL's user info, nor a piece of it, in an
// error, whatever the URL looks like and wherever connecting fails.
func TestConnectNATSErrorHidesUserInfo(t *testing.T) {
	t.Parallel()
	for _, url := range leakyNATSURLs {
		nc, err := ConnectNATS(url)
		if err == nil {
			nc.Close()
			t.Fatalf("%q: connected", url)
		}
		for _, secret := range natsURLSecrets {
			if strings.Contains(err.Error(), secret) {
				t.Errorf("ConnectNATS(%q) error shows %q: %v", url, secret, err)
			}
		}
		if !strings.Contains(err.Error(), "NATS") {
			t.Errorf("ConnectNATS(%q): %v: want it to say NATS", url, err)
		}
	}
}

// Through the commands too: --nats-url of relay status and relay
// prune-claims, and NATS_URL.
func TestRelayCommandsHideNATSCredentials(t *testing.T) {
	e := newRelayEnv(t)
	check := func(args []string) {
		t.Helper()
		out, code := e.run(Config{}, args...)
		if code == ExitOK {
			t.Fatalf("%v: exit 0:\n%s", args, out)
		}
		for _, secret := range natsURLSecrets {
			if strings.Contains(out, secret) {
				t.Errorf("%v prints %q:\n%s", args, secret, out)
			}
		}
	}
	for _, url := range leakyNATSURLs[:3] {
		check([]string{"relay", "status", "--nats-url", url})
		check([]string{"relay", "prune-claims", "--older-than", "24h", "--nats-url", url})
	}
	t.Setenv("NATS_URL", leakyNATSURLs[0])
	check([]string{"relay", "status"})
	check([]string{"relay", "prune-claims", "--older-than", "24h"})
}
