package testbed

import (
	"slices"
	"strings"
	"testing"

	"github.com/mptcp-operator/mptcp-operator/internal/netnsutil"
)

// Beds that allow a congestion control hold the machine's list widened
// together: it has the name while any holds it, its own list again once
// the last lets go, and a checker cannot hold the list meanwhile. A name
// the list has already is left in it.
func TestAllowedCongestionControlsAreWidenedWhileABedHoldsThem(t *testing.T) {
	RequireRoot(t)
	allowed := func() []string {
		t.Helper()
		v, err := netnsutil.ReadSysctl("", allowedCC)
		if err != nil {
			t.Fatal(err)
		}
		return strings.Fields(v)
	}
	was := allowed()
	name := "cubic"
	available, err := netnsutil.ReadSysctl("", "net.ipv4.tcp_available_congestion_control")
	if err != nil || !slices.Contains(strings.Fields(available), name) || slices.Contains(was, name) {
		t.Skipf("needs %s available and not allowed in namespaces (available %q, allowed %v)", name, available, was)
	}
	first, err := AllowCongestionControl(name)
	if err != nil {
		t.Fatal(err)
	}
	second, err := AllowCongestionControl(name)
	if err != nil {
		t.Fatal(err)
	}
	if _, held := HoldAllowedCongestionControls(); held {
		t.Error("the list was held while beds widened it")
	}
	if got := allowed(); !slices.Contains(got, name) {
		t.Errorf("allowed %v while two beds hold %s", got, name)
	}
	if err := first(); err != nil {
		t.Fatal(err)
	}
	if got := allowed(); !slices.Contains(got, name) {
		t.Errorf("allowed %v while a bed still holds %s", got, name)
	}
	if err := second(); err != nil {
		t.Fatal(err)
	}
	if got := allowed(); !slices.Equal(got, was) {
		t.Errorf("allowed %v after every bed let go, want the machine's own %v", got, was)
	}
	release, held := HoldAllowedCongestionControls()
	defer release()
	if !held {
		t.Error("the list could not be held once every bed let go")
	}
}
