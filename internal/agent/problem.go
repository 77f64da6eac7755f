package agent

import (
	"errors"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
)

// Problem is one thing that keeps a node state from being enforced, whole
// or in part, as it arises: Reason is the reason of the node state's
// Degraded condition it stands for (one of api/v1alpha1's: InvalidSpec,
// InterfaceMissing, ApplyFailed, MarkClash), Message what status.errors
// says of it.
type Problem struct {
	Reason  string
	Message string
}

func (p Problem) String() string { return p.Message }

// Messages are the problems' messages in order; nil for none.
func Messages(problems []Problem) []string {
	if len(problems) == 0 {
		return nil
	}
	out := make([]string, len(problems))
	for i, p := range problems {
		out[i] = p.Message
	}
	return out
}

// ApplyProblem is the problem of a reconcile that failed with err: the
// node's CNI uses the mark mask's bits (MarkClash, nothing is enforced),
// or the kernel refused part of the configuration (ApplyFailed).
func ApplyProblem(err error) Problem {
	reason := mptcpv1alpha1.ReasonApplyFailed
	if errors.Is(err, ErrMarkClash) {
		reason = mptcpv1alpha1.ReasonMarkClash
	}
	return Problem{Reason: reason, Message: err.Error()}
}
