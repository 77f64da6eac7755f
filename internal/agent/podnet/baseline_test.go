package podnet

import (
	"net/netip"
	"os"
	"reflect"
	"testing"

	"github.com/mptcp-operator/mptcp-operator/internal/mptcpnl"
	"github.com/mptcp-operator/mptcp-operator/internal/netnsutil"
	"github.com/mptcp-operator/mptcp-operator/test/testutil"
)

// podNamespace creates a network namespace for a test and returns its path.
func podNamespace(t *testing.T) string {
	t.Helper()
	name := testutil.NetNS(t, "mptbl-")
	return "/var/run/netns/" + name
}

// podMPTCPState reads what Configure changes in a pod's namespace.
func podMPTCPState(t *testing.T, pod Pod) podBaseline {
	t.Helper()
	st := podBaseline{Sysctls: map[string]string{}}
	for _, key := range podMPTCPSysctls {
		v, err := netnsutil.ReadSysctl(pod.NetNS, key)
		if err != nil {
			t.Fatal(err)
		}
		st.Sysctls[key] = v
	}
	err := withPM(pod, func(c *mptcpnl.Conn) (err error) {
		if st.Limits, err = c.GetLimits(); err != nil {
			return err
		}
		st.Endpoints, err = c.Endpoints()
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// A pod whose namespace held settings of its own (DSS checksums on, other
// limits, a signal endpoint) gets exactly those back when the agent
// releases it, not the kernel's defaults; the baseline is taken once, before
// the first change, and forgotten once restored. A baseline of another
// namespace under the same pod name is no baseline.
func TestReleasedPodGetsItsOwnMPTCPSettingsBack(t *testing.T) {
	pod := Pod{Name: "apps/web", NetNS: podNamespace(t), IPs: []netip.Addr{netip.MustParseAddr("192.0.2.7")}}
	if err := netnsutil.WriteSysctl(pod.NetNS, "net.mptcp.checksum_enabled", "1"); err != nil {
		t.Fatal(err)
	}
	err := withPM(pod, func(c *mptcpnl.Conn) error {
		if err := c.SetLimits(mptcpnl.Limits{Subflows: 3, AddAddrAccepted: 1}); err != nil {
			return err
		}
		return c.AddEndpoint(mptcpnl.Endpoint{Addr: netip.MustParseAddr("192.0.2.7"), ID: 5, Port: 7000, Flags: mptcpnl.FlagSignal})
	})
	if err != nil {
		t.Fatal(err)
	}
	before := podMPTCPState(t, pod)

	store := NewBaselines(t.TempDir())
	if err := store.Record(pod); err != nil {
		t.Fatal(err)
	}
	if err := Configure(pod, MPTCP{Subflows: Userspace, Joins: 1}); err != nil {
		t.Fatal(err)
	}
	configured := podMPTCPState(t, pod)
	if reflect.DeepEqual(configured, before) {
		t.Fatalf("configuring the pod changed nothing: %+v", configured)
	}
	// A later reconcile records nothing over the first baseline.
	if err := store.Record(pod); err != nil {
		t.Fatal(err)
	}
	restored, err := store.Restore(pod)
	if err != nil || !restored {
		t.Fatalf("restore: %v, %v", restored, err)
	}
	if after := podMPTCPState(t, pod); !reflect.DeepEqual(after, before) {
		t.Errorf("after the release the pod holds %+v, before the agent it held %+v", after, before)
	}
	if _, err := os.Stat(store.path(pod.Name)); !os.IsNotExist(err) {
		t.Errorf("the baseline is still kept after its restore: %v", err)
	}

	// The same name, another namespace: the baseline is forgotten, nothing
	// is written into the new namespace.
	if err := store.Record(pod); err != nil {
		t.Fatal(err)
	}
	other := Pod{Name: pod.Name, NetNS: podNamespace(t)}
	if restored, err := store.Restore(other); err != nil || restored {
		t.Errorf("restoring another namespace's baseline: %v, %v", restored, err)
	}
	if store.Has(pod) {
		t.Errorf("the stale baseline is still kept")
	}
}
