package benchdoc

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// MaxLineChars is the longest line docs/ takes (hack/docs checks it).
const MaxLineChars = 120

// Wrap breaks the prose lines of a section longer than MaxLineChars at the
// last space that fits and is outside a `code span`, a list item's
// continuation indented under its text. A table with a row too long loses
// the spaces around its cells ("|a|b|"); a row cannot be broken, so one
// still too long needs narrower columns (LongLines finds it). Headings and
// fenced code are left as they are.
func Wrap(body string) string {
	lines := strings.Split(body, "\n")
	out := make([]string, 0, len(lines))
	fenced := false
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		trimmed := strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(trimmed, "```"):
			fenced = !fenced
			out = append(out, line)
		case fenced || strings.HasPrefix(trimmed, "#"):
			out = append(out, line)
		case strings.HasPrefix(trimmed, "|"):
			end := i
			for end < len(lines) && strings.HasPrefix(strings.TrimSpace(lines[end]), "|") {
				end++
			}
			out = append(out, narrowTable(lines[i:end])...)
			i = end - 1
		default:
			out = append(out, wrapLine(line)...)
		}
	}
	return strings.Join(out, "\n")
}

// narrowTable returns a table's rows as they are if every one fits, else
// every row without the spaces around its cells.
func narrowTable(rows []string) []string {
	if len(LongLines(strings.Join(rows, "\n"))) == 0 {
		return rows
	}
	out := make([]string, len(rows))
	for i, row := range rows {
		cells := strings.Split(strings.TrimSpace(row), "|")
		for j := range cells {
			cells[j] = strings.TrimSpace(cells[j])
		}
		out[i] = strings.Join(cells, "|")
	}
	return out
}

// wrapLine breaks one prose line; its continuations take the indent of
// its text (after a list marker, if it has one).
func wrapLine(line string) []string {
	indent := strings.Repeat(" ", continuationIndent(line))
	var out []string
	for utf8.RuneCountInString(line) > MaxLineChars {
		cut := breakAt(line)
		if cut < 0 {
			break
		}
		out = append(out, line[:cut])
		line = indent + strings.TrimLeft(line[cut:], " ")
	}
	return append(out, line)
}

// breakAt is the byte offset of the last space outside a code span whose
// line up to it fits, past the indent; failing that, the last such space
// inside one (a code span too long for a line, such as a command, renders
// its line break as the space it was); -1 if there is none.
func breakAt(line string) int {
	lead := len(line) - len(strings.TrimLeft(line, " "))
	outside, inside, inCode, chars := -1, -1, false, 0
	for i, r := range line {
		if chars > MaxLineChars {
			break
		}
		switch {
		case r == '`':
			inCode = !inCode
		case r == ' ' && i > lead && inCode:
			inside = i
		case r == ' ' && i > lead:
			outside = i
		}
		chars++
	}
	if outside < 0 {
		return inside
	}
	return outside
}

// continuationIndent is where the text of a line starts: after its
// leading spaces and a list marker ("- ", "* ", "1. ").
func continuationIndent(line string) int {
	rest := strings.TrimLeft(line, " ")
	n := len(line) - len(rest)
	switch {
	case strings.HasPrefix(rest, "- "), strings.HasPrefix(rest, "* "):
		return n + 2
	}
	digits := len(rest) - len(strings.TrimLeft(rest, "0123456789"))
	if digits > 0 && strings.HasPrefix(rest[digits:], ". ") {
		return n + digits + 2
	}
	return n
}

// LongLines names the lines of body over MaxLineChars, one string each
// (line number, length and its start), so that a report says what to
// narrow.
func LongLines(body string) []string {
	var long []string
	for i, line := range strings.Split(body, "\n") {
		if n := utf8.RuneCountInString(line); n > MaxLineChars {
			start := line
			if len(start) > 60 {
				start = start[:60] + "…"
			}
			long = append(long, fmt.Sprintf("line %d: %d characters: %s", i+1, n, start))
		}
	}
	return long
}
