package cli

import (
	"strings"

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
