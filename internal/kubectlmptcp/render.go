package kubectlmptcp

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"unicode"

	"github.com/mptcp-operator/mptcp-operator/internal/agentapi"
	"github.com/mptcp-operator/mptcp-operator/internal/explain"
)

// PodSubflows are a pod's live connections with their subflows.
type PodSubflows struct {
	Namespace   string                   `json:"namespace"`
	Name        string                   `json:"name"`
	Node        string                   `json:"node"`
	Connections []agentapi.PodConnection `json:"connections"`
}

// WriteJSON writes v as indented JSON: what -o json prints.
func WriteJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// WriteStatus prints s as tables.
func WriteStatus(w io.Writer, s *Status) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tAGENT\tREADY\tDEGRADED\tPODS\tSKIPPED\tPATHS\tREASON")
	for _, n := range s.Nodes {
		var paths []string
		for _, p := range n.Paths {
			state := p.Link
			if p.Liveness != "" {
				state += "/" + p.Liveness
			}
			paths = append(paths, printable(fmt.Sprintf("%s(%s)=%s", p.Name, p.Interface, state)))
		}
		reason := n.Reason
		if n.Message != "" {
			reason += ": " + n.Message
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\n", printable(n.Name), n.Agent, n.Ready, n.Degraded, n.Pods, n.Skipped, strings.Join(paths, " "), oneLine(reason))
	}
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "POLICY\tREADY\tDEGRADED\tPODS\tNODES READY\tREASON")
	for _, p := range s.Policies {
		reason := p.Reason
		if p.Message != "" {
			reason += ": " + p.Message
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d/%d\t%s\n", printable(p.Name), p.Ready, p.Degraded, p.Pods, p.NodesReady, p.Nodes, oneLine(reason))
	}
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "PATH\tINDEX\tREADY\tMESSAGE")
	for _, p := range s.Paths {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\n", printable(p.Name), p.Index, p.Ready, oneLine(p.Message))
	}
	return tw.Flush()
}

// WriteExplanation prints e as its steps, each cause marked.
func WriteExplanation(w io.Writer, e explain.Explanation) error {
	fmt.Fprintf(w, "Pod %s/%s", printable(e.Namespace), printable(e.Name))
	if e.Node != "" {
		fmt.Fprintf(w, " on node %s", printable(e.Node))
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, s := range e.Steps {
		mark := "ok"
		switch {
		case s.Cause != "":
			mark = string(s.Cause)
		case s.Unread:
			mark = "not read"
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\n", s.Name, mark, printable(s.Detail))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(e.Unread) > 0 {
		// A cause may hide in what could not be read: never a bare "No
		// cause found" then.
		fmt.Fprintf(w, "Not checked: %s (the rights to read them are missing, or the agent could not be reached: see each step)\n", printable(strings.Join(e.Unread, ", ")))
	}
	if len(e.Causes) == 0 {
		msg := "No cause found."
		if len(e.Unread) > 0 {
			msg = "No cause found in the steps checked."
		}
		_, err := fmt.Fprintln(w, msg)
		return err
	}
	var names []string
	for _, c := range e.Causes {
		names = append(names, string(c))
	}
	_, err := fmt.Fprintf(w, "Causes: %s (docs/troubleshooting.md, \"kubectl mptcp explain\")\n", strings.Join(names, ", "))
	return err
}

// WriteSubflows prints each connection and its subflows.
func WriteSubflows(w io.Writer, s *PodSubflows) error {
	fmt.Fprintf(w, "Pod %s/%s on node %s: %d connections\n", printable(s.Namespace), printable(s.Name), printable(s.Node), len(s.Connections))
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CONNECTION\tSUBFLOW\tPATH\tROLE\tTX BYTES\tRX BYTES")
	for _, c := range s.Connections {
		fmt.Fprintf(tw, "%s\t%s\t%s\t\t%d\t%d\n", printable(c.Token), printable(c.Local), printable(strings.Join(c.Paths, ",")), c.TxBytes, c.RxBytes)
		for _, sf := range c.Subflows {
			path := sf.Path
			if sf.Detour != "" {
				path += " (detour " + sf.Detour + ")"
			}
			fmt.Fprintf(tw, "\t%s -> %s\t%s\t%s\t%d\t%d\n", printable(sf.Local), printable(sf.Remote), printable(path), printable(sf.Role), sf.TxBytes, sf.RxBytes)
		}
	}
	return tw.Flush()
}

// oneLine is s on one line, at most 120 characters, printable.
func oneLine(s string) string {
	s = strings.Join(strings.Fields(printable(s)), " ")
	if r := []rune(s); len(r) > 120 {
		s = string(r[:117]) + "..."
	}
	return s
}

// printable replaces the control characters of s: names, messages and
// notes come from pods, nodes and events that others write, and an escape
// sequence in one must not reach the reader's terminal.
func printable(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '\t' || r == '\n' {
			return ' '
		}
		// Format characters too: a right-to-left override or an
		// isolate reorders what a terminal shows.
		if unicode.IsControl(r) || unicode.Is(unicode.Cf, r) || r == unicode.ReplacementChar {
			return '?'
		}
		return r
	}, s)
}
