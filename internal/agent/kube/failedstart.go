package kube

import (
	"context"
	"encoding/json"
	"fmt"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/internal/agent/nodecheck"
)

// ReportFailedStart writes, to the node's MPTCPNodeState, the checks of an
// agent that could not start (no BTF, no bpffs, a kernel without MPTCP) and
// why, so that kubectl mptcp preflight shows them while the agent's pod
// restarts. Nothing is written when the node has no state yet.
func ReportFailedStart(ctx context.Context, cfg *rest.Config, node string, checks []mptcpv1alpha1.NodeCheck, startErr error) error {
	scheme := runtime.NewScheme()
	if err := mptcpv1alpha1.AddToScheme(scheme); err != nil {
		return err
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return err
	}
	// Listed by name, as the agent's cache reads it: its role may list and
	// watch its node state, not get it.
	var states mptcpv1alpha1.MPTCPNodeStateList
	if err := c.List(ctx, &states, client.MatchingFieldsSelector{Selector: fields.OneTermEqualSelector("metadata.name", node)}); err != nil {
		return err
	}
	if len(states.Items) == 0 {
		return nil
	}
	state := states.Items[0]
	// The failed check that explains it, if one does.
	passed, reason, failed := nodecheck.Summary(checks)
	msg := fmt.Sprintf("the agent cannot start: %v", startErr)
	if passed {
		reason = ReasonStartFailed
	} else {
		msg += " (" + failed + ")"
	}
	conds := state.Status.Conditions
	meta.SetStatusCondition(&conds, metav1.Condition{Type: ConditionNodeSupported, Status: metav1.ConditionFalse, Reason: reason,
		Message: msg, ObservedGeneration: state.Generation})
	patch, err := json.Marshal(map[string]any{"status": map[string]any{"checks": checks, "conditions": conds}})
	if err != nil {
		return err
	}
	return c.Status().Patch(ctx, &state, client.RawPatch(types.MergePatchType, patch))
}
