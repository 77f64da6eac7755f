// Package kubectlmptcp is the kubectl mptcp plugin: status, explain and
// subflows. It reads everything through the API server: the operator's
// objects, pods and events, and what an agent knows of a pod by running the
// agent binary in the agent's own container (pods/exec), so the API
// server's RBAC decides who may read it and no node shell is needed.
package kubectlmptcp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"
	"k8s.io/streaming/pkg/httpstream"
	"sigs.k8s.io/controller-runtime/pkg/client"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/internal/agentapi"
	"github.com/mptcp-operator/mptcp-operator/internal/explain"
)

// The agent's pods as the chart labels them, and its container and binary
// as the agent image lays them out.
const (
	agentComponentLabel = "app.kubernetes.io/component"
	agentNameLabel      = "app.kubernetes.io/name"
	agentContainer      = "agent"
	agentBinary         = "/usr/local/bin/agent"
	agentDaemonSet      = "mptcp-agent"
	// The most an agent's answer may hold: a pod report of full tables is
	// a few MiB.
	maxAgentAnswer = 32 << 20
	maxAgentError  = 4 << 10
)

// Cluster reads the cluster through one API server.
type Cluster struct {
	config *rest.Config
	c      client.Client
	// AgentNamespace, when set, is where the agent's pods are looked for
	// (the release's namespace); empty: every namespace.
	AgentNamespace string
}

// NewCluster connects to the API server of config.
func NewCluster(config *rest.Config) (*Cluster, error) {
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := mptcpv1alpha1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	c, err := client.New(config, client.Options{Scheme: scheme})
	if err != nil {
		return nil, err
	}
	return &Cluster{config: config, c: c}, nil
}

// Facts gathers what explain reads of pod namespace/name. What cannot be
// read (a forbidden list, an agent that cannot be reached) is left out and
// said, so that a tenant with fewer rights still gets the steps it can.
func (k *Cluster) Facts(ctx context.Context, namespace, name string) (explain.Facts, error) {
	var f explain.Facts
	pod := &corev1.Pod{}
	if err := k.c.Get(ctx, types.NamespacedName{Namespace: namespace, Name: name}, pod); err != nil {
		return f, err
	}
	f.Pod = pod
	ns := &corev1.Namespace{}
	if err := k.c.Get(ctx, types.NamespacedName{Name: namespace}, ns); err == nil {
		f.Namespace = ns
	} else {
		f.NamespaceError = err.Error()
	}
	if pod.Spec.NodeName != "" {
		state := &mptcpv1alpha1.MPTCPNodeState{}
		err := k.c.Get(ctx, types.NamespacedName{Name: pod.Spec.NodeName}, state)
		switch {
		case err == nil:
			f.NodeState = state
		case ctx.Err() != nil:
			return f, err
		case !apierrors.IsNotFound(err):
			// A tenant may not read node states (they list every pod of
			// the node): explain walks what it can without.
			f.NodeStateError = err.Error()
		}
	}
	var policies mptcpv1alpha1.MPTCPPolicyList
	if err := k.c.List(ctx, &policies); err == nil {
		f.Policies = policies.Items
	} else {
		f.PoliciesError = err.Error()
	}
	var events eventsv1.EventList
	if err := k.c.List(ctx, &events, client.InNamespace(namespace),
		client.MatchingFieldsSelector{Selector: fields.OneTermEqualSelector("regarding.name", name)}); err == nil {
		for _, e := range events.Items {
			if e.Regarding.Kind == "Pod" && e.Regarding.UID == pod.UID {
				f.Events = append(f.Events, e)
			}
		}
	} else {
		f.EventsError = err.Error()
	}
	if pod.Spec.NodeName != "" && !pod.Spec.HostNetwork {
		report, err := k.AgentReport(ctx, pod.Spec.NodeName, namespace, name)
		if err != nil {
			f.AgentError = err.Error()
		} else {
			f.Agent = report
		}
	}
	return f, nil
}

// AgentReport asks the agent of node what it knows of pod namespace/name.
func (k *Cluster) AgentReport(ctx context.Context, node, namespace, name string) (*agentapi.PodReport, error) {
	out, err := k.agentGet(ctx, node, "/v1/pods/"+namespace+"/"+name)
	if err != nil {
		return nil, err
	}
	var r agentapi.PodReport
	if err := json.Unmarshal(out, &r); err != nil {
		return nil, fmt.Errorf("the agent's answer: %w", err)
	}
	return &r, nil
}

// agentGet runs `agent -local-api-get path` in the agent's container on
// node, through the API server, and returns what it printed.
func (k *Cluster) agentGet(ctx context.Context, node, path string) ([]byte, error) {
	agent, err := k.agentPod(ctx, node)
	if err != nil {
		return nil, err
	}
	cmd := []string{agentBinary, "-local-api-get", path, "-node", node}
	for _, c := range agent.Spec.Containers {
		if c.Name != agentContainer {
			continue
		}
		if len(c.Command) > 0 {
			cmd[0] = c.Command[0]
		}
		// A settings file given to the agent names its state directory.
		for _, a := range c.Args {
			if strings.HasPrefix(a, "-config=") || strings.HasPrefix(a, "--config=") {
				cmd = append(cmd, a)
			}
		}
	}
	stdout, stderr := &limitedBuffer{max: maxAgentAnswer}, &limitedBuffer{max: maxAgentError}
	if err := k.exec(ctx, agent, cmd, stdout, stderr); err != nil {
		msg := strings.TrimSpace(printable(stderr.String()))
		if msg != "" {
			return nil, fmt.Errorf("agent %s/%s: %s", agent.Namespace, agent.Name, msg)
		}
		return nil, fmt.Errorf("running the agent's query in %s/%s (needs create on pods/exec there): %w", agent.Namespace, agent.Name, err)
	}
	return stdout.Bytes(), nil
}

// agentBinding is the chart's ClusterRoleBinding of the agents: its
// ServiceAccount subject says in which namespace, and as whom, the agents
// run.
const agentBinding = "mptcp-agent"

// agentIdentity is the namespace and ServiceAccount of the agents, from
// the chart's ClusterRoleBinding: cluster-scoped, so no tenant can write
// it, and a tenant's pod that carries the agent's labels is not taken for
// an agent. Where the binding cannot be read, --agent-namespace names the
// namespace and any ServiceAccount is taken.
func (k *Cluster) agentIdentity(ctx context.Context) (namespace, account string, err error) {
	var crb rbacv1.ClusterRoleBinding
	err = k.c.Get(ctx, types.NamespacedName{Name: agentBinding}, &crb)
	switch {
	case err == nil:
		for _, s := range crb.Subjects {
			if s.Kind == rbacv1.ServiceAccountKind {
				if k.AgentNamespace != "" && s.Namespace != k.AgentNamespace {
					return "", "", fmt.Errorf("--agent-namespace %s, but the ClusterRoleBinding %s binds agents in %s", k.AgentNamespace, agentBinding, s.Namespace)
				}
				return s.Namespace, s.Name, nil
			}
		}
		return "", "", fmt.Errorf("the ClusterRoleBinding %s binds no ServiceAccount", agentBinding)
	case k.AgentNamespace != "":
		return k.AgentNamespace, "", nil
	case apierrors.IsNotFound(err):
		return "", "", fmt.Errorf("no ClusterRoleBinding %s: is the chart installed? (--agent-namespace names its namespace)", agentBinding)
	default:
		return "", "", fmt.Errorf("reading the ClusterRoleBinding %s, which says where the agents run (--agent-namespace names it instead): %w", agentBinding, err)
	}
}

// agentPods lists the running agent pods: in the agents' namespace, run as
// their ServiceAccount, owned by the chart's DaemonSet. opts narrow it.
func (k *Cluster) agentPods(ctx context.Context, opts ...client.ListOption) ([]corev1.Pod, error) {
	namespace, account, err := k.agentIdentity(ctx)
	if err != nil {
		return nil, err
	}
	var pods corev1.PodList
	opts = append(opts, client.InNamespace(namespace),
		client.MatchingLabels{agentComponentLabel: "agent", agentNameLabel: "mptcp-operator"})
	if err := k.c.List(ctx, &pods, opts...); err != nil {
		return nil, err
	}
	var out []corev1.Pod
	for _, p := range pods.Items {
		owner := metav1.GetControllerOf(&p)
		if p.Status.Phase != corev1.PodRunning || p.DeletionTimestamp != nil || owner == nil ||
			owner.Kind != "DaemonSet" || owner.Name != agentDaemonSet || (account != "" && p.Spec.ServiceAccountName != account) {
			continue
		}
		out = append(out, p)
	}
	return out, nil
}

// agentPod finds the running agent pod of node.
func (k *Cluster) agentPod(ctx context.Context, node string) (*corev1.Pod, error) {
	pods, err := k.agentPods(ctx, client.MatchingFieldsSelector{Selector: fields.OneTermEqualSelector("spec.nodeName", node)})
	if err != nil {
		return nil, err
	}
	if len(pods) == 0 {
		return nil, fmt.Errorf("no running agent pod on node %s", node)
	}
	return &pods[0], nil
}

// exec runs cmd in the agent container of pod, as kubectl exec does:
// WebSockets first, SPDY where the API server does not upgrade to them.
func (k *Cluster) exec(ctx context.Context, pod *corev1.Pod, cmd []string, stdout, stderr io.Writer) error {
	cs, err := kubernetes.NewForConfig(k.config)
	if err != nil {
		return err
	}
	req := cs.CoreV1().RESTClient().Post().Resource("pods").Namespace(pod.Namespace).Name(pod.Name).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Container: agentContainer, Command: cmd, Stdout: true, Stderr: true}, clientgoscheme.ParameterCodec)
	spdy, err := remotecommand.NewSPDYExecutor(k.config, "POST", req.URL())
	if err != nil {
		return err
	}
	ws, err := remotecommand.NewWebSocketExecutor(k.config, "GET", req.URL().String())
	if err != nil {
		return err
	}
	executor, err := remotecommand.NewFallbackExecutor(ws, spdy, func(err error) bool {
		return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
	})
	if err != nil {
		return err
	}
	err = executor.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: stdout, Stderr: stderr})
	if err != nil && errors.Is(err, context.Canceled) {
		return ctx.Err()
	}
	return err
}

// limitedBuffer holds what is written to it, up to max bytes; a write past
// that fails, which ends the stream.
type limitedBuffer struct {
	bytes.Buffer
	max int
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	if b.Len()+len(p) > b.max {
		return 0, fmt.Errorf("the agent's answer is larger than %d bytes", b.max)
	}
	return b.Buffer.Write(p)
}
