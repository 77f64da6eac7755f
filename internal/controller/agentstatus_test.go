package controller_test

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/internal/agent"
	"github.com/mptcp-operator/mptcp-operator/test/testenv"
	"github.com/mptcp-operator/mptcp-operator/test/testutil"
)

// heldEnforcer is a recordingEnforcer whose first Reconcile waits until the
// test releases it, so that the node state can change under a reconcile.
type heldEnforcer struct {
	*recordingEnforcer
	entered, release chan struct{}
	once             sync.Once
}

func (e *heldEnforcer) Reconcile(ctx context.Context, p *agent.Plan) ([]mptcpv1alpha1.PodProblem, error) {
	e.once.Do(func() {
		close(e.entered)
		select {
		case <-e.release:
		case <-ctx.Done(): // the manager stops: the test failed first
		}
	})
	return e.recordingEnforcer.Reconcile(ctx, p)
}

// laggingCache reads the node state through the manager's cache, except
// once, when the test has set an older copy: a cache that has not yet seen
// the agent's own last status write.
type laggingCache struct {
	client.Client
	mu    sync.Mutex
	older *mptcpv1alpha1.MPTCPNodeState
}

func (c *laggingCache) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	c.mu.Lock()
	older := c.older
	c.older = nil
	c.mu.Unlock()
	if s, ok := obj.(*mptcpv1alpha1.MPTCPNodeState); ok && older != nil {
		older.DeepCopyInto(s)
		return nil
	}
	return c.Client.Get(ctx, key, obj, opts...)
}

func (c *laggingCache) lagOnce(s *mptcpv1alpha1.MPTCPNodeState) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.older = s.DeepCopy()
}

// TestAgentStatusIsWholeAfterAReadFromALaggingCache: the controller takes
// the node's pods away (generation 2) while the agent enforces generation
// 1, whose status, written next, lists the pods' policy as applied; the
// agent's next read is the copy from before that write (a cache that lags
// its own writes). Its status of generation 2 must still end with no
// policy applied: a patch computed from that copy alone would leave the
// list out (empty in the copy and in the new status) and the server's
// stale list would stay until the resync, which status changes do not
// bring forward.
func TestAgentStatusIsWholeAfterAReadFromALaggingCache(t *testing.T) {
	env := testenv.Start(t, testenv.ServiceAccountTokens())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	env.Namespace(t, agentNamespace, nil)
	applyDir(t, env.Client, filepath.Join(testenv.RepoRoot(), "config", "agent"))
	if err := env.Client.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}); err != nil {
		t.Fatal(err)
	}
	env.Namespace(t, "tenant-a", nil)
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "tenant-a", Name: "web"},
		Spec: corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/c"}}}}
	if err := env.Client.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	state := &mptcpv1alpha1.MPTCPNodeState{ObjectMeta: metav1.ObjectMeta{Name: "n1"}, Spec: mptcpv1alpha1.MPTCPNodeStateSpec{
		PodCIDRs: []string{"10.244.1.0/24"},
		Paths: []mptcpv1alpha1.NodePath{{Name: "fabric-a", Index: 1, Interface: mptcpv1alpha1.InterfaceSelector{Name: "nic1"},
			Capacity: resource.MustParse("1G")}},
		Rules: []mptcpv1alpha1.CompiledRule{{Name: "spread", Policy: "spread", PolicyGeneration: 1, MaxSubflows: 2,
			SpreadMode: mptcpv1alpha1.SpreadRoundRobin, SubflowCreation: mptcpv1alpha1.SubflowCreationUserspace,
			Paths: []mptcpv1alpha1.RulePath{{Name: "fabric-a", Weight: 1}}}},
		Pods: []mptcpv1alpha1.NodePod{{Namespace: "tenant-a", Name: "web", UID: string(pod.UID), IPs: []string{"10.244.1.10"}, Rules: []string{"spread"}}},
	}}
	if err := env.Client.Create(ctx, state); err != nil {
		t.Fatal(err)
	}

	enforcer := &heldEnforcer{recordingEnforcer: &recordingEnforcer{}, entered: make(chan struct{}), release: make(chan struct{})}
	var cache *laggingCache
	// A resync longer than the test: only the agent's own handling of
	// the stale read can end it well.
	runAgentReconciler(t, env, enforcer, time.Hour, func(c client.Client) client.Client {
		cache = &laggingCache{Client: c}
		return cache
	})

	// Generation 1 is being enforced; the controller takes the pod away.
	select {
	case <-enforcer.entered:
	case <-time.After(30 * time.Second):
		t.Fatal("the agent never enforced generation 1")
	}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(state), state); err != nil {
		t.Fatal(err)
	}
	state.Spec.Pods, state.Spec.Rules = nil, nil
	if err := env.Client.Update(ctx, state); err != nil {
		t.Fatal(err)
	}
	// The agent's next read of the state is this copy: generation 2,
	// before generation 1's status is written.
	cache.lagOnce(state)
	close(enforcer.release)

	var got mptcpv1alpha1.MPTCPNodeState
	testutil.Eventually(t, 10*time.Second, 100*time.Millisecond, "generation 2's status with no policy applied", func() error {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(state), &got); err != nil {
			return err
		}
		if got.Status.ObservedGeneration != 2 || len(got.Status.AppliedPolicies) != 0 {
			return fmt.Errorf("observed generation %d, applied policies %+v", got.Status.ObservedGeneration, got.Status.AppliedPolicies)
		}
		return nil
	})
}
