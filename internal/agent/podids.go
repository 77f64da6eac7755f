package agent

import (
	"errors"
	"fmt"

	"github.com/mptcp-operator/mptcp-operator/internal/agent/shaping"
	"github.com/mptcp-operator/mptcp-operator/internal/datapath"
)

// A pod's shaping classes (one per path NIC and rule of its chain that caps
// it per pod, planShaping) are numbered by the pod's id: shaping.MinorPod +
// id*datapath.MaxPodRules + the rule's place in the pod's chain. An id is
// the pod's while the node state lists it, whatever other pods come and go:
// numbered by the pod's place among the node's pods, a pod another tenant
// adds with a name that sorts first would move every later pod's class, and
// with it its queue (dropped) and its rate (its neighbour's for a moment).
// The ids are kept in the state directory as the rules' are (ruleids.go),
// so a restart keeps them; a table that is not there (the first start of a
// release that keeps one) gives the pods the ids of their places, which is
// how their classes were numbered before.
const podIDsFile = "pod-ids.json"

// maxPodIDs is how many pods the class minors hold after shaping.MinorPod.
const maxPodIDs = (1<<16 - shaping.MinorPod) / datapath.MaxPodRules

func newPodIDs() *idTable {
	return &idTable{ByName: map[string]uint32{}, file: podIDsFile, size: maxPodIDs, what: "pod", heldBy: "the node's pods"}
}

func readPodIDs(stateDir string) *idTable {
	t, _ := newPodIDs().read(stateDir)
	return t
}

// podKey names a pod in the table: a pod re-created under the same name is
// another pod.
func podKey(p PlanPod) string { return p.Ref.Namespace + "/" + p.Ref.Name + "/" + p.Ref.UID }

// assignPodIDs gives each pod of plan its id, in plan order (namespace,
// name) for the pods that have none yet.
func (a *Agent) assignPodIDs(plan *Plan) (map[string]uint32, error) {
	want := make([]string, 0, len(plan.Pods))
	for _, p := range plan.Pods {
		want = append(want, podKey(p))
	}
	ids, err := a.podIDs.assign(want, nil, nil)
	if werr := a.podIDs.write(a.settings.StateDir); werr != nil {
		err = errors.Join(err, fmt.Errorf("keeping the pod ids: %w", werr))
	}
	return ids, err
}

// retirePodIDs frees the ids of the pods that current (assignPodIDs) does
// not have: the reconcile that left them out removed their classes.
func (a *Agent) retirePodIDs(current map[string]uint32) error {
	want := make(map[string]bool, len(current))
	for name := range current {
		want[name] = true
	}
	if len(a.podIDs.retire(want, nil)) == 0 {
		return nil
	}
	if err := a.podIDs.write(a.settings.StateDir); err != nil {
		return fmt.Errorf("keeping the pod ids: %w", err)
	}
	return nil
}
