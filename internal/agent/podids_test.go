package agent

import (
	"maps"
	"net/netip"
	"testing"
)

// A pod keeps its id (the number of its shaping classes) while it is in the
// plan, whatever pods come before it by name, and across a restart; a new
// table numbers the pods by their places, as classes were numbered before
// the table; a pod re-created under the same name is another pod.
func TestPodIDsNeverMoveWhileThePodIsThere(t *testing.T) {
	dir := t.TempDir()
	pod := func(ns, name, uid string) PlanPod {
		return PlanPod{Ref: PodRef{Namespace: ns, Name: name, UID: uid}, IPs: []netip.Addr{netip.MustParseAddr("10.244.1.10")}}
	}
	a := &Agent{settings: Settings{StateDir: dir}, podIDs: readPodIDs(dir)}
	step := func(pods ...PlanPod) map[string]uint32 {
		t.Helper()
		ids, err := a.assignPodIDs(&Plan{Pods: pods})
		if err != nil {
			t.Fatal(err)
		}
		if err := a.retirePodIDs(ids); err != nil {
			t.Fatal(err)
		}
		return ids
	}
	web, db := pod("tenant-b", "web", "u1"), pod("tenant-c", "db", "u2")
	if ids := step(web, db); ids[podKey(web)] != 0 || ids[podKey(db)] != 1 {
		t.Fatalf("a new table: %v, want the pods' places", ids)
	}
	first := pod("tenant-a", "first", "u3")
	if ids := step(first, web, db); ids[podKey(web)] != 0 || ids[podKey(db)] != 1 || ids[podKey(first)] != 2 {
		t.Fatalf("a pod that sorts first: %v, want web and db kept on 0 and 1", ids)
	}
	// A restart reads the same table.
	a.podIDs = readPodIDs(dir)
	if want := map[string]uint32{podKey(first): 2, podKey(web): 0, podKey(db): 1}; !maps.Equal(a.podIDs.ByName, want) {
		t.Fatalf("table after a restart %v, want %v", a.podIDs.ByName, want)
	}
	// web goes; re-created under its name, it is another pod, and takes
	// the lowest free id once its old one is free.
	if ids := step(first, db); ids[podKey(first)] != 2 || ids[podKey(db)] != 1 {
		t.Fatalf("web gone: %v", ids)
	}
	again := pod("tenant-b", "web", "u4")
	if ids := step(first, again, db); ids[podKey(again)] != 0 || ids[podKey(first)] != 2 || ids[podKey(db)] != 1 {
		t.Fatalf("web re-created: %v, want it on the freed 0, the others kept", ids)
	}
}
