package jetstream

import (
	"errors"
	"fmt"
	"strings"

	"github.com/projectorhq/projector"
)

// ErrInvalidConfig: a relay or consumer was configured wrongly (a subject
// prefix with wildcards or empty tokens, a stream name NATS would refuse, a
// duplicate window shorter than the relay needs). Nothing is published.
var ErrInvalidConfig = errors.New("jetstream: invalid configuration")

// DefaultPrefix is the first subject token(s) of every relayed event.
const DefaultPrefix = "projector"

// Subject returns the subject an event is published on:
// <prefix>.<tenant>.<stream type>.<event type>, each of the last three
// escaped with [EscapeToken] so no tenant or type can add a token, a
// wildcard or whitespace. Subscribers filter with ordinary wildcards:
// "projector.acme.ticket.>" is every event of acme's tickets.
func Subject(prefix string, ev projector.Event) string {
	return prefix + "." + EscapeToken(ev.Stream.Tenant) + "." + EscapeToken(ev.Stream.Type) + "." + EscapeToken(ev.Type)
}

// EscapeToken makes s one safe NATS subject token: ASCII letters, digits,
// '-' and '_' stay as they are; every other byte (the '.' of
// "ticket.opened", '*', '>', spaces, '%' itself, UTF-8) becomes %XX with
// upper-case hex, as in URL percent-encoding. An empty string becomes a
// lone "%" (a token may not be empty, and every other '%' is followed by two
// hex digits). The
// encoding is reversible with [UnescapeToken], and a consumer in another
// language can build a filter for "ticket.opened" as "ticket%2Eopened".
func EscapeToken(s string) string {
	if s == "" {
		return "%"
	}
	if plainToken(s) {
		return s
	}
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	b.Grow(len(s) + 8)
	for i := 0; i < len(s); i++ {
		c := s[i]
		if plainByte(c) {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(hex[c>>4])
		b.WriteByte(hex[c&15])
	}
	return b.String()
}

// UnescapeToken reverses [EscapeToken].
func UnescapeToken(tok string) (string, error) {
	if tok == "%" {
		return "", nil
	}
	if plainToken(tok) {
		return tok, nil
	}
	var b strings.Builder
	for i := 0; i < len(tok); i++ {
		c := tok[i]
		switch {
		case plainByte(c):
			b.WriteByte(c)
		case c == '%' && i+2 < len(tok) && unhex(tok[i+1]) >= 0 && unhex(tok[i+2]) >= 0:
			b.WriteByte(byte(unhex(tok[i+1])<<4 | unhex(tok[i+2])))
			i += 2
		default:
			return "", fmt.Errorf("subject token %s: byte %d is not escaped", projector.Quoted(tok), i)
		}
	}
	return b.String(), nil
}

func unhex(c byte) int {
	switch {
	case '0' <= c && c <= '9':
		return int(c - '0')
	case 'A' <= c && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}

func plainByte(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_'
}

func plainToken(s string) bool {
	for i := 0; i < len(s); i++ {
		if !plainByte(s[i]) {
			return false
		}
	}
	return s != ""
}

// ValidatePrefix accepts a subject prefix of one or more dot-separated
// tokens of ASCII letters, digits, '-' and '_': no wildcards, no empty
// tokens, no spaces, so the relay's stream owns exactly <prefix>.>.
func ValidatePrefix(prefix string) error {
	if prefix == "" {
		return fmt.Errorf("%w: empty subject prefix", ErrInvalidConfig)
	}
	if len(prefix) > 128 {
		return fmt.Errorf("%w: subject prefix longer than 128 bytes", ErrInvalidConfig)
	}
	for _, tok := range strings.Split(prefix, ".") {
		if !plainToken(tok) {
			return fmt.Errorf("%w: subject prefix %s: token %s must be ASCII letters, digits, '-' or '_' (no wildcards or empty tokens)", ErrInvalidConfig, projector.Quoted(prefix), projector.Quoted(tok))
		}
	}
	// _INBOX carries every client's request replies: a stream over it
	// would capture them (an audit).
	if first, _, _ := strings.Cut(prefix, "."); strings.EqualFold(first, "_INBOX") {
		return fmt.Errorf("%w: subject prefix %s: _INBOX is NATS's, for request replies", ErrInvalidConfig, projector.Quoted(prefix))
	}
	return nil
}
