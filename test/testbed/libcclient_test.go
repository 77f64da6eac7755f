package testbed

import (
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net"
	"os/exec"
	"strconv"
	"testing"
)

// The hashes LibcClientReports gives are those of what the C client
// really wrote: two connections over loopback, one of them longer than the
// pattern's period and not a multiple of it.
func TestLibcClientReportsHashWhatItWrote(t *testing.T) {
	prog := BuildLibcClient(t, t.TempDir())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan ServerReport, 2)
	go func() {
		for range 2 {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			h := sha256.New()
			n, err := io.Copy(h, c)
			c.Close()
			got <- ServerReport{Remote: c.RemoteAddr().String(), Bytes: n, SHA256: hex.EncodeToString(h.Sum(nil)), Error: errString(err)}
		}
	}()
	out, err := exec.Command(prog, "-c", "2", "-n", "200001", "127.0.0.1", strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)).Output()
	if err != nil {
		t.Fatalf("%s: %v", prog, err)
	}
	sent, err := LibcClientReports(out)
	if err != nil {
		t.Fatal(err)
	}
	if len(sent) != 2 || sent[0].Bytes != 200001 {
		t.Fatalf("the client reported %+v, want two connections of 200001 bytes", sent)
	}
	if _, err := MatchReports(sent, []ServerReport{<-got, <-got}); err != nil {
		t.Error(err)
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
