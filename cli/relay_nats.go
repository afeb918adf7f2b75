package cli

import (
	"errors"
	"fmt"
	neturl "net/url"
	"strings"

	"github.com/nats-io/nats.go"
)

// ConnectNATS connects to the NATS server(s) at url (one URL or a
// comma-separated list, as nats.Connect takes) with opts. Its errors never
// show a URL's user info (user, password or token), nor a piece of it a
// parse error would quote: the URL is named as jetstream.RedactURL prints
// it. Use it wherever a URL from a flag or NATS_URL is connected to.
func ConnectNATS(url string, opts ...nats.Option) (*nats.Conn, error) {
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		err = fmt.Errorf("connect to NATS at %s: %w", RedactNATSURL(url), scrubNATSError(err, url))
		if uerr := (*neturl.Error)(nil); errors.As(err, &uerr) {
			// A URL that does not parse is a bad command line (exit 2),
			// as an unparsable --database-url is.
			return nil, usageError{err}
		}
		return nil, err
	}
	return nc, nil
}

// RedactNATSURL is url with the user info of each server replaced by
// "xxxxx", for messages: nats://xxxxx@host:4222.
func RedactNATSURL(url string) string {
	servers := strings.Split(url, ",")
	for i, s := range servers {
		s = strings.TrimSpace(s)
		if at := strings.LastIndexByte(s, '@'); at >= 0 {
			start := 0
			if j := strings.Index(s, "://"); j >= 0 && j < at {
				start = j + len("://")
			}
			s = s[:start] + "xxxxx" + s[at:]
		}
		servers[i] = s
	}
	return strings.Join(servers, ",")
}

// scrubNATSError hides the user info of every server of url in err's text.
// A URL that does not parse gets a message of its own when it holds user
// info: net/url quotes the offending piece, which may be the password's.
func scrubNATSError(err error, url string) error {
	var secrets []string
	for _, s := range strings.Split(url, ",") {
		s = strings.TrimSpace(s)
		at := strings.LastIndexByte(s, '@')
		if at < 0 {
			continue
		}
		info := s[:at]
		if j := strings.Index(info, "://"); j >= 0 {
			info = info[j+len("://"):]
		}
		secrets = append(secrets, info)
		for _, part := range strings.Split(info, ":") {
			if part != "" {
				secrets = append(secrets, part)
				if u, err := neturl.PathUnescape(part); err == nil && u != part {
					secrets = append(secrets, u)
				}
			}
		}
	}
	if len(secrets) == 0 {
		return err
	}
	if uerr := (*neturl.Error)(nil); errors.As(err, &uerr) {
		return &hiddenError{msg: "the URL does not parse (not shown: it holds credentials; percent-encode '%', '@', ':' and '/' in them)", err: err}
	}
	// Longest first, so a part never leaves the rest of a longer secret.
	for i := range secrets {
		for j := i + 1; j < len(secrets); j++ {
			if len(secrets[j]) > len(secrets[i]) {
				secrets[i], secrets[j] = secrets[j], secrets[i]
			}
		}
	}
	return scrub(err, secrets)
}
