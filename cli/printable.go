package cli

import (
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"unicode/utf8"

	"github.com/projectorhq/projector"
)

// How much of a stored free-text value (an error, a document, a saga's
// state) human-readable output shows: a table cell, or a line of its own
// in a show command. -o json, where a command has it, shows all of it.
const (
	cellText = 60
	lineText = 2000
)

// text renders stored free text for a terminal on one line: runs of white
// space become one space, then projector.PrintableText escapes what a
// terminal would obey and cuts it at limit bytes, noting the length. Every
// human-readable output of stored data goes through it or, for names,
// projector.Printable: anyone who can append an event or make a handler
// fail must not be able to rewrite an operator's screen.
func text(s string, limit int) string {
	return projector.PrintableText(oneLineText(s), limit)
}

// oneLineText is s with every run of white space (newlines included) made
// one space.
func oneLineText(s string) string { return strings.Join(strings.Fields(s), " ") }

// names renders stored names with projector.Printable, joined by ", ".
func names(list []string) string {
	out := make([]string, len(list))
	for i, s := range list {
		out[i] = projector.Printable(s)
	}
	return strings.Join(out, ", ")
}

// quoted is projector.Quoted, short for the many sentences here.
func quoted(s string) string { return projector.Quoted(s) }

// checkName refuses, as a bad command line naming flag, a name filter no
// stored name can match: not valid UTF-8, holding a NUL byte (PostgreSQL
// text cannot store either) or over projector.MaxNameLength bytes.
func checkName(flag, v string) error {
	if err := projector.ValidText(v); err != nil || len(v) > projector.MaxNameLength {
		return usageError{fmt.Errorf("%s %s: not a name (valid UTF-8 without NUL, at most %d bytes)", flag, projector.Printable(v), projector.MaxNameLength)}
	}
	return nil
}

// checkPrintableName is checkName for a name this command also prints
// (an instance id in its own log lines, in status tables): it must show as
// typed, so control characters, escape sequences and invisible runes are
// refused rather than escaped.
func checkPrintableName(flag, v string) error {
	if err := checkName(flag, v); err != nil {
		return err
	}
	if projector.Printable(v) != v {
		return usageError{fmt.Errorf("%s %s: holds a character that does not print (a control character or an escape)", flag, projector.Printable(v))}
	}
	return nil
}

// maxMessage bounds the error line Run prints: a value echoed whole (a
// 100 kB flag) would bury the message.
const maxMessage = 4096

// terminalLine makes the error line Run prints safe for a terminal and
// short: every rune a terminal would obey or cannot show (ESC and the other
// control characters, invisible format runes, invalid UTF-8) is written as
// its Go escape where it stands, leaving the rest of the sentence as it
// reads, and a line over maxMessage bytes is cut, noting its length. The
// commands make what they quote printable already; this is the net for
// what they pass on from elsewhere (cobra's flag errors, a driver's).
func terminalLine(s string) string {
	n := len(s)
	if n > maxMessage {
		cut := maxMessage
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut]
	}
	out := projector.EscapeControls(s)
	if n > maxMessage {
		out += fmt.Sprintf("…(%d bytes)", n)
	}
	return out
}

// printablePathError is err with the file name of an *fs.PathError made
// printable: the name is what the operator typed, and os puts it into the
// error as it is, escape sequences and newlines included.
func printablePathError(err error) error {
	var pe *fs.PathError
	if !errors.As(err, &pe) {
		return err
	}
	return &hiddenError{msg: fmt.Sprintf("%s %s: %v", pe.Op, projector.Printable(pe.Path), pe.Err), err: err}
}
