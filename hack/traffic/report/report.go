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
	// Samples are the bytes received in each interval of SampleSeconds
	// from the first byte (serve -sample), for finding stalls.
	SampleSeconds float64 `json:"sample_s,omitempty"`
	Samples       []int64 `json:"samples,omitempty"`
	// Verification compares what arrived with the stream the preamble
	// names, byte by byte (hack/traffic/stream.go).
	Verification *Verification `json:"verification,omitempty"`
	// Stopped is true when the server was told to stop while the
	// connection was still open: the line reports what had arrived then.
	Stopped bool   `json:"stopped,omitempty"`
	Error   string `json:"error,omitempty"`
}

// Verification is what a server found comparing a stream with the one
// its sender's preamble names.
type Verification struct {
	// Verified is false when the stream carried no preamble the server
	// knows (another client); the hashes are then all there is.
	Verified bool   `json:"verified"`
	Seed     uint64 `json:"seed,omitempty"`
	Conn     int    `json:"conn,omitempty"`
	// Ranges are the stream offsets [Start, End) whose bytes differ from
	// what was sent (preamble included in the offsets; ranges closer than
	// 64 bytes are merged). At most 32; Truncated on the last says more
	// followed.
	Ranges []Range `json:"ranges,omitempty"`
	// Samples show the first bytes of each range as received and as sent.
	Samples []Sample `json:"samples,omitempty"`
}

// Range is a stretch of a stream, as offsets from its first byte.
type Range struct {
	Start     int64 `json:"start"`
	End       int64 `json:"end"`
	Truncated bool  `json:"truncated,omitempty"`
}

// Sample is the start of a changed range.
type Sample struct {
	Offset int64  `json:"offset"`
	Got    string `json:"got"`  // hex
	Want   string `json:"want"` // hex
	// FoundAt is the offset in the sent stream where the received bytes
	// occur (within 8 MiB of Offset), or -1: a hit means data placed at
	// the wrong offset, a miss bytes that were never sent there.
	FoundAt int64 `json:"found_at"`
}

// Sender is one line of the sender's output.
type Sender struct {
	Conn   int    `json:"conn"`
	Seed   uint64 `json:"seed"`
	Local  string `json:"local"`
	Remote string `json:"remote"`
	MPTCP  bool   `json:"mptcp"`
	Bytes  int64  `json:"bytes"`
	SHA256 string `json:"sha256"`
	// Blocks are the first 8 hex digits of the SHA-256 of each 1 MiB block.
	Blocks []string `json:"blocks,omitempty"`
	// Seconds is the time from the stream's start (connect, or the end of
	// send -await-joins) to close.
	Seconds float64 `json:"s"`
	// JoinsAwaited is how many joins the connection had when the sender
	// started writing after send -await-joins; JoinWaitTimedOut says it
	// stopped waiting for the rest.
	JoinsAwaited     int    `json:"joins_awaited,omitempty"`
	JoinWaitTimedOut bool   `json:"join_wait_timed_out,omitempty"`
	Error            string `json:"error,omitempty"`
}
