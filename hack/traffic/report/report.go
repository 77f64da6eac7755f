// Package report defines the JSON lines hack/traffic prints: one per
// connection, from the server when it closes and from the sender when it ends.
package report

// Server is one line of the server's report, written when a connection closes.
type Server struct {
	Local  string `json:"local"`
	Remote string `json:"remote"`
	// MPTCP reports whether the connection really runs MPTCP (false if it fell back to TCP).
	MPTCP  bool   `json:"mptcp"`
	Bytes  int64  `json:"bytes"`
	SHA256 string `json:"sha256"`
	// Blocks are the first 8 hex digits of the SHA-256 of each 1 MiB block.
	Blocks []string `json:"blocks,omitempty"`
	// GoodputBps is the payload rate in bits/s over [WindowStart, WindowStart+WindowSeconds] after the first byte.
	GoodputBps float64 `json:"goodput_bps"`
	// WindowStart and WindowSeconds state the window actually measured; WindowSeconds is shorter than asked when
	// the connection ended early (then WindowShort is true).
	WindowStart   float64 `json:"window_start_s"`
	WindowSeconds float64 `json:"window_s"`
	WindowShort   bool    `json:"window_short,omitempty"`
	// DurationSeconds runs from the first byte to the end of the stream.
	DurationSeconds float64 `json:"duration_s"`
	Error           string  `json:"error,omitempty"`
}

// Sender is one line of the sender's output.
type Sender struct {
	Conn   int    `json:"conn"`
	Local  string `json:"local"`
	Remote string `json:"remote"`
	MPTCP  bool   `json:"mptcp"`
	Bytes  int64  `json:"bytes"`
	SHA256 string `json:"sha256"`
	// Blocks are the first 8 hex digits of the SHA-256 of each 1 MiB block.
	Blocks []string `json:"blocks,omitempty"`
	// Seconds is the time from connect to close.
	Seconds float64 `json:"s"`
	Error   string  `json:"error,omitempty"`
}
