package netnsutil

import (
	"os"
	"path/filepath"
	"testing"
)

// The agent in a container reads and writes sysctls through a mount of the
// host's /proc/sys/net outside /proc; ProcSys says where, and every key,
// a per-interface one whose interface name has a dot included, lands below it.
func TestSysctlsAreReadAndWrittenBelowProcSys(t *testing.T) {
	root := t.TempDir()
	defer func(old string) { ProcSys = old }(ProcSys)
	ProcSys = root
	dir := filepath.Join(root, "net", "ipv4", "conf", "nic1.100")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "src_valid_mark"), []byte("0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	const key = "net.ipv4.conf.nic1.100.src_valid_mark"
	if got, err := ReadSysctl("", key); err != nil || got != "0" {
		t.Fatalf("ReadSysctl(%s) = %q, %v; want \"0\"", key, got, err)
	}
	if err := WriteSysctl("", key, "1"); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "src_valid_mark"))
	if err != nil || string(b) != "1" {
		t.Fatalf("%s/src_valid_mark holds %q, %v; want \"1\"", dir, b, err)
	}
}
