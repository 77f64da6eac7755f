package charts

import (
	"bytes"
	"encoding/json"
	"maps"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/internal/agent"
	"github.com/mptcp-operator/mptcp-operator/internal/agent/observe"
	"github.com/mptcp-operator/mptcp-operator/test/testenv"
	"github.com/mptcp-operator/mptcp-operator/test/testutil"
)

// TestHelmChart is the chart's package of checks, one subtest each: rendered
// with helm (schema, capabilities, mounts, RBAC, optional parts, images),
// applied to a real API server, upgraded, and its versions against what
// they record. It is the e2e area TestChart's counterpart without nodes,
// named apart so that `make test` runs it in its first, parallel phase.
func TestHelmChart(t *testing.T) {
	for _, c := range []struct {
		name  string
		check func(*testing.T)
	}{
		{"ARealAPIServerAcceptsTheChart", aRealAPIServerAcceptsTheChart},
		{"AgentGetsExactlyTheCapabilitiesItDeclares", agentGetsExactlyTheCapabilitiesItDeclares},
		{"AgentMountsWhatTheAgentUses", agentMountsWhatTheAgentUses},
		{"AgentRunsOnTheHostNetworkOfTheSelectedNodes", agentRunsOnTheHostNetworkOfTheSelectedNodes},
		{"AgentWatchesItsOwnDaemonSetAndNothingElse", agentWatchesItsOwnDaemonSetAndNothingElse},
		{"AgentMetricsAddressAndAuthentication", agentMetricsAddressAndAuthentication},
		{"ServiceMonitorVerifiesTheAgentsCertificates", serviceMonitorVerifiesTheAgentsCertificates},
		{"ControllerMetricsNeedAuthorizedTokensByDefault", controllerMetricsNeedAuthorizedTokensByDefault},
		{"ControllerIsANonRootLeaderElectedDeploymentWithABudget", controllerIsANonRootLeaderElectedDeploymentWithABudget},
		{"CRDsAndControllerRulesAreControllerGensOutput", crdsAndControllerRulesAreControllerGensOutput},
		{"AgentIdentityFollowsNamespaceAndServiceAccount", agentIdentityFollowsNamespaceAndServiceAccount},
		{"PodsTakePullSecretsLabelsAndAnnotations", podsTakePullSecretsLabelsAndAnnotations},
		{"CommonLabelsAccountAnnotationsAndSecurityContexts", commonLabelsAccountAnnotationsAndSecurityContexts},
		{"OptionalPartsRenderOnlyWhenAsked", optionalPartsRenderOnlyWhenAsked},
		{"DefaultImagesAreWhatMakeImagesBuilds", defaultImagesAreWhatMakeImagesBuilds},
		{"OneRegistryValueMovesEveryImage", oneRegistryValueMovesEveryImage},
		{"WebhookRendersForOptedInNamespacesAndFailsOpen", webhookRendersForOptedInNamespacesAndFailsOpen},
		{"WebhookClientAuthMountsTheCAOnlyWhenSet", webhookClientAuthMountsTheCAOnlyWhenSet},
		{"ExtraArgsEnvAndSpreadReachThePods", extraArgsEnvAndSpreadReachThePods},
		{"HelmTestRunsTheConformanceCheck", helmTestRunsTheConformanceCheck},
		{"HelmTestHoldsNoClusterWideWriteAndEveryHookGoes", helmTestHoldsNoClusterWideWriteAndEveryHookGoes},
		{"RolesForPeopleAggregateAndCoverThePlugin", rolesForPeopleAggregateAndCoverThePlugin},
		{"WebhookNetworkPolicyAdmitsOnlyTheGivenPeers", webhookNetworkPolicyAdmitsOnlyTheGivenPeers},
		{"BadValuesAreRefusedWithAClearMessage", badValuesAreRefusedWithAClearMessage},
		{"JoinHoldoffSchemaAgreesWithTheAgent", joinHoldoffSchemaAgreesWithTheAgent},
		{"LivenessSchemaAgreesWithTheAgent", livenessSchemaAgreesWithTheAgent},
		{"HelmUpgradeReuseValuesFromTheOldestChart", helmUpgradeReuseValuesFromTheOldestChart},
		{"ChartVersionMovesWithTheChart", chartVersionMovesWithTheChart},
		{"AppVersionMovesWithTheBinaries", appVersionMovesWithTheBinaries},
	} {
		t.Run(c.name, c.check)
	}
}

// declaredCapabilities are the agent's capabilities as Kubernetes names them.
func declaredCapabilities() []corev1.Capability {
	var caps []corev1.Capability
	for _, c := range agent.Capabilities() {
		caps = append(caps, corev1.Capability(strings.ToUpper(c)))
	}
	return caps
}

func agentGetsExactlyTheCapabilitiesItDeclares(t *testing.T) {
	r := render(t)
	ds := get[*appsv1.DaemonSet](t, r, "DaemonSet", "mptcp-agent")
	c := container(t, ds.Spec.Template.Spec, "agent")
	sc := c.SecurityContext
	if sc == nil || sc.Capabilities == nil {
		t.Fatal("the agent's container has no capabilities in its security context")
	}
	if !slices.Equal(sc.Capabilities.Add, declaredCapabilities()) {
		t.Errorf("the DaemonSet adds %v; the agent declares %v (internal/agent.Capabilities)", sc.Capabilities.Add, declaredCapabilities())
	}
	if !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
		t.Errorf("the DaemonSet drops %v, want [ALL]", sc.Capabilities.Drop)
	}
	if sc.Privileged == nil || *sc.Privileged {
		t.Error("the agent must run explicitly unprivileged (privileged: false)")
	}

	// The schema allows exactly the declared set: an admin may drop one,
	// never add another.
	var schema struct {
		Properties struct {
			Agent struct {
				Properties struct {
					Capabilities struct {
						Items struct {
							Enum []corev1.Capability `json:"enum"`
						} `json:"items"`
					} `json:"capabilities"`
				} `json:"properties"`
			} `json:"agent"`
		} `json:"properties"`
	}
	if err := json.Unmarshal(readFile(t, filepath.Join(chartDir(), "values.schema.json")), &schema); err != nil {
		t.Fatal(err)
	}
	if enum := schema.Properties.Agent.Properties.Capabilities.Items.Enum; !slices.Equal(enum, declaredCapabilities()) {
		t.Errorf("values.schema.json allows the capabilities %v; the agent declares %v", enum, declaredCapabilities())
	}
}

// The agent finds its pins, state and pods' namespaces at its own defaults;
// the chart mounts the host's directories exactly there, and a writable
// /proc/sys/net where -proc-sys says.
func agentMountsWhatTheAgentUses(t *testing.T) {
	r := render(t)
	ds := get[*appsv1.DaemonSet](t, r, "DaemonSet", "mptcp-agent")
	spec := ds.Spec.Template.Spec
	c := container(t, spec, "agent")

	for _, m := range []struct {
		name        string
		hostPath    string
		covers      string // a path the agent uses, which the mount must hold
		propagation corev1.MountPropagationMode
	}{
		{"bpffs", "/sys/fs/bpf", agent.DefaultPinRoot, corev1.MountPropagationHostToContainer},
		{"state", "/run/mptcp-operator", agent.DefaultStateRoot, ""},
		{"netns", "/var/run/netns", agent.NetNSDir, corev1.MountPropagationHostToContainer},
	} {
		vm, ok := mount(c, m.name)
		if !ok {
			t.Errorf("no %s mount", m.name)
			continue
		}
		if m.covers != vm.MountPath && !strings.HasPrefix(m.covers, vm.MountPath+"/") {
			t.Errorf("%s is mounted at %s, which does not hold the agent's %s", m.name, vm.MountPath, m.covers)
		}
		if vm.ReadOnly {
			t.Errorf("%s is mounted read-only; the agent writes there", m.name)
		}
		got := corev1.MountPropagationMode("")
		if vm.MountPropagation != nil {
			got = *vm.MountPropagation
		}
		if got != m.propagation {
			t.Errorf("%s propagation %q, want %q", m.name, got, m.propagation)
		}
		v, ok := volume(spec, m.name)
		if !ok || v.HostPath == nil || v.HostPath.Path != m.hostPath {
			t.Errorf("volume %s is %+v, want hostPath %s", m.name, v.VolumeSource, m.hostPath)
		}
	}

	procSys, ok := flagValue(c.Args, "-proc-sys")
	if !ok {
		t.Fatalf("the agent is not told where /proc/sys/net is writable (-proc-sys): args %v", c.Args)
	}
	vm, ok := mount(c, "proc-sys-net")
	switch {
	case !ok:
		t.Error("no writable /proc/sys/net mount")
	case vm.MountPath != procSys+"/net" || vm.ReadOnly:
		t.Errorf("/proc/sys/net is mounted at %s (read-only %v), want %s/net writable", vm.MountPath, vm.ReadOnly, procSys)
	case strings.HasPrefix(vm.MountPath, "/proc/"):
		t.Errorf("%s is inside /proc, where runc refuses mounts", vm.MountPath)
	}
	if v, ok := volume(spec, "proc-sys-net"); !ok || v.HostPath == nil || v.HostPath.Path != "/proc/sys/net" {
		t.Errorf("volume proc-sys-net is not the host's /proc/sys/net")
	}
}

func agentRunsOnTheHostNetworkOfTheSelectedNodes(t *testing.T) {
	r := render(t)
	ds := get[*appsv1.DaemonSet](t, r, "DaemonSet", "mptcp-agent")
	spec := ds.Spec.Template.Spec
	c := container(t, spec, "agent")

	must(t, spec.HostNetwork, "hostNetwork is off")
	must(t, spec.DNSPolicy == corev1.DNSClusterFirstWithHostNet, "dnsPolicy %q, want ClusterFirstWithHostNet", spec.DNSPolicy)
	must(t, spec.PriorityClassName == "system-node-critical", "priorityClassName %q", spec.PriorityClassName)
	must(t, slices.ContainsFunc(spec.Tolerations, func(tol corev1.Toleration) bool {
		return tol.Operator == corev1.TolerationOpExists && tol.Key == ""
	}), "the agent does not tolerate every taint: %v", spec.Tolerations)

	// The nodes the examples' MPTCPPaths select get an agent.
	var path mptcpv1alpha1.MPTCPPath
	firstDoc := testutil.YAMLDocuments(t, readFile(t, filepath.Join(testenv.RepoRoot(), "examples", "paths.yaml")))[0]
	if err := yaml.Unmarshal(firstDoc, &path); err != nil {
		t.Fatal(err)
	}
	for k, v := range path.Spec.NodeSelector.MatchLabels {
		must(t, spec.NodeSelector[k] == v, "nodeSelector %v misses the examples' %s=%s", spec.NodeSelector, k, v)
	}

	u := ds.Spec.UpdateStrategy
	if u.Type != appsv1.RollingUpdateDaemonSetStrategyType || u.RollingUpdate == nil {
		t.Fatalf("updateStrategy %+v, want RollingUpdate", u)
	}
	must(t, u.RollingUpdate.MaxSurge != nil && u.RollingUpdate.MaxSurge.IntValue() == 0,
		"maxSurge %v: two agents on a node would share its pins", u.RollingUpdate.MaxSurge)
	must(t, u.RollingUpdate.MaxUnavailable != nil && u.RollingUpdate.MaxUnavailable.IntValue() == 1,
		"maxUnavailable %v, want 1", u.RollingUpdate.MaxUnavailable)

	// Kube mode with the pod's service account, on the node the pod runs on.
	must(t, slices.Contains(c.Args, "-kubeconfig=in-cluster"), "args %v lack -kubeconfig=in-cluster", c.Args)
	must(t, slices.Contains(c.Args, "-node=$(NODE_NAME)"), "args %v lack -node=$(NODE_NAME)", c.Args)
	nodeName := false
	for _, e := range c.Env {
		if e.Name == "NODE_NAME" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName" {
			nodeName = true
		}
	}
	must(t, nodeName, "NODE_NAME is not the pod's spec.nodeName")

	// Probes on the port the agent serves them on by default.
	_, defaultPort, err := net.SplitHostPort(observe.DefaultMetricsAddr)
	if err != nil {
		t.Fatal(err)
	}
	addr, _ := flagValue(c.Args, "-metrics-addr")
	must(t, addr == ":"+defaultPort, "-metrics-addr=%s, want the agent's default :%s", addr, defaultPort)
	for probe, want := range map[*corev1.Probe]string{c.LivenessProbe: "/healthz", c.ReadinessProbe: "/readyz"} {
		if probe == nil || probe.HTTPGet == nil {
			t.Errorf("no HTTP probe for %s", want)
			continue
		}
		must(t, probe.HTTPGet.Path == want && probe.HTTPGet.Port.String() == "metrics", "probe %s on port %s, want %s on metrics", probe.HTTPGet.Path, probe.HTTPGet.Port.String(), want)
	}
	_, ok := envValue(c, "KUBERNETES_SERVICE_HOST")
	must(t, !ok, "KUBERNETES_SERVICE_HOST is set by default; the default is the in-cluster Service")
}

// A stopping agent uninstalls only when its DaemonSet is deleted: it is
// told which DaemonSet it runs under (this one, in the release's namespace),
// and may read that one and nothing else of its namespace.
func agentWatchesItsOwnDaemonSetAndNothingElse(t *testing.T) {
	r := render(t, "--namespace", "net-ops")
	ds := get[*appsv1.DaemonSet](t, r, "DaemonSet", "mptcp-agent")
	c := container(t, ds.Spec.Template.Spec, "agent")
	owner, ok := flagValue(c.Args, "-daemonset")
	must(t, ok && owner == ds.Namespace+"/"+ds.Name, "-daemonset=%q, want %s/%s", owner, ds.Namespace, ds.Name)

	role := get[*rbacv1.Role](t, r, "Role", "mptcp-agent")
	want := []rbacv1.PolicyRule{{APIGroups: []string{"apps"}, Resources: []string{"daemonsets"}, ResourceNames: []string{ds.Name}, Verbs: []string{"get", "list", "watch"}}}
	must(t, role.Namespace == "net-ops" && reflect.DeepEqual(role.Rules, want), "Role %s/%s grants %+v, want %+v", role.Namespace, role.Name, role.Rules, want)
	b := get[*rbacv1.RoleBinding](t, r, "RoleBinding", "mptcp-agent")
	must(t, b.RoleRef.Kind == "Role" && b.RoleRef.Name == role.Name && len(b.Subjects) == 1 &&
		b.Subjects[0].Name == ds.Spec.Template.Spec.ServiceAccountName && b.Subjects[0].Namespace == "net-ops",
		"RoleBinding %+v does not bind the Role to the agent's service account", b)
}

// Where the agents serve metrics, and whether /metrics needs credentials
// (internal/agent/metricsauth): each value renders the flags, probes, RBAC,
// Service port and ServiceMonitor endpoint that go with it.
func agentMetricsAddressAndAuthentication(t *testing.T) {
	agentOf := func(r *rendered) corev1.Container {
		return container(t, get[*appsv1.DaemonSet](t, r, "DaemonSet", "mptcp-agent").Spec.Template.Spec, "agent")
	}
	probes := func(c corev1.Container) []*corev1.HTTPGetAction {
		return []*corev1.HTTPGetAction{c.LivenessProbe.HTTPGet, c.ReadinessProbe.HTTPGet}
	}

	def := render(t)
	c := agentOf(def)
	addr, _ := flagValue(c.Args, "-metrics-addr")
	must(t, addr == ":9402", "by default -metrics-addr=%s, want every address (:9402)", addr)
	must(t, slices.Contains(c.Args, "-metrics-auth"), "-metrics-auth off by default: args %v", c.Args)
	for _, p := range probes(c) {
		must(t, p.Scheme == corev1.URISchemeHTTPS, "probe %s over %s by default, the agent serves HTTPS", p.Path, p.Scheme)
	}
	must(t, def.has("ClusterRoleBinding", "mptcp-agent-metrics-auth") && def.has("ClusterRole", "mptcp-metrics-reader"),
		"by default the agent may not review tokens, or nobody can be allowed to read its metrics")

	off := render(t, "--set", "agent.metricsAuth.enabled=false", "--set", "controller.metricsAuth.enabled=false")
	c = agentOf(off)
	must(t, !slices.Contains(c.Args, "-metrics-auth"), "agent.metricsAuth.enabled=false: args %v have -metrics-auth", c.Args)
	for _, p := range probes(c) {
		must(t, p.Scheme == "" || p.Scheme == corev1.URISchemeHTTP, "agent.metricsAuth.enabled=false: probe %s over %s", p.Path, p.Scheme)
	}
	must(t, !off.has("ClusterRoleBinding", "mptcp-agent-metrics-auth") && !off.has("ClusterRole", "mptcp-metrics-reader"),
		"the agent may review tokens without metricsAuth")

	hostIP := agentOf(render(t, "--set", "agent.metricsAddress=hostIP"))
	addr, _ = flagValue(hostIP.Args, "-metrics-addr")
	must(t, addr == "[$(HOST_IP)]:9402", "hostIP: -metrics-addr=%s", addr)
	must(t, slices.ContainsFunc(hostIP.Env, func(e corev1.EnvVar) bool {
		return e.Name == "HOST_IP" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "status.hostIP"
	}), "hostIP: HOST_IP is not the pod's status.hostIP")

	loopback := agentOf(render(t, "--set", "agent.metricsAddress=loopback"))
	addr, _ = flagValue(loopback.Args, "-metrics-addr")
	must(t, addr == "127.0.0.1:9402", "loopback: -metrics-addr=%s", addr)
	for _, p := range probes(loopback) {
		must(t, p.Host == "127.0.0.1", "loopback: probe %s asks host %q; the kubelet would probe the node's address", p.Path, p.Host)
	}

	auth := render(t, "--set", "agent.metricsAuth.enabled=true", "--set", "agent.metricsAuth.certSecret=agent-metrics-tls",
		"--set", "metrics.serviceMonitor.enabled=true", "--set", "controller.metricsAuth.enabled=false")
	c = agentOf(auth)
	must(t, slices.Contains(c.Args, "-metrics-auth"), "metricsAuth: args %v lack -metrics-auth", c.Args)
	dir, _ := flagValue(c.Args, "-metrics-cert-dir")
	m, ok := mount(c, "metrics-tls")
	must(t, ok && m.MountPath == dir && m.ReadOnly, "metricsAuth: the certificate is mounted at %+v, the agent reads %s", m, dir)
	v, ok := volume(get[*appsv1.DaemonSet](t, auth, "DaemonSet", "mptcp-agent").Spec.Template.Spec, "metrics-tls")
	must(t, ok && v.Secret != nil && v.Secret.SecretName == "agent-metrics-tls", "metricsAuth: volume %+v is not the Secret", v)
	for _, p := range probes(c) {
		must(t, p.Scheme == corev1.URISchemeHTTPS, "metricsAuth: probe %s over %s, the agent serves HTTPS", p.Path, p.Scheme)
	}
	b := get[*rbacv1.ClusterRoleBinding](t, auth, "ClusterRoleBinding", "mptcp-agent-metrics-auth")
	must(t, b.RoleRef.Name == "system:auth-delegator" && len(b.Subjects) == 1 && b.Subjects[0].Name == "mptcp-agent",
		"metricsAuth: the agent may not review tokens: %+v", b)
	reader := get[*rbacv1.ClusterRole](t, auth, "ClusterRole", "mptcp-metrics-reader")
	must(t, len(reader.Rules) == 1 && slices.Equal(reader.Rules[0].NonResourceURLs, []string{"/metrics"}) && slices.Equal(reader.Rules[0].Verbs, []string{"get"}),
		"metricsAuth: the reader role is %+v", reader.Rules)
	svc := get[*corev1.Service](t, auth, "Service", "mptcp-agent-metrics")
	must(t, len(svc.Spec.Ports) == 1 && svc.Spec.Ports[0].Name == "https-metrics", "metricsAuth: Service ports %+v", svc.Spec.Ports)
	sm := get[*unstructured.Unstructured](t, auth, "ServiceMonitor", "mptcp-operator")
	endpoints, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
	must(t, slices.ContainsFunc(endpoints, func(e any) bool {
		m, _ := e.(map[string]any)
		return m["port"] == "https-metrics" && m["scheme"] == "https" && m["bearerTokenFile"] != nil
	}), "metricsAuth: no https endpoint with a token in %v", endpoints)
}

// With agent.metricsAuth, Prometheus sends its service account's token to
// each agent it scrapes: it must check that the agent is one, or whoever
// answers on a node's address gets the token. The ServiceMonitor verifies
// the agents' certificates unless the admin says otherwise in so many words.
func serviceMonitorVerifiesTheAgentsCertificates(t *testing.T) {
	// agentEndpoint is the ServiceMonitor's endpoint of the agents' HTTPS
	// port, and its tlsConfig.
	agentEndpoint := func(r *rendered) map[string]any {
		t.Helper()
		sm := get[*unstructured.Unstructured](t, r, "ServiceMonitor", "mptcp-operator")
		endpoints, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
		for _, e := range endpoints {
			if m, _ := e.(map[string]any); m["port"] == "https-metrics" {
				tls, _ := m["tlsConfig"].(map[string]any)
				return tls
			}
		}
		t.Fatalf("no endpoint for the agents' https-metrics port in %v", endpoints)
		return nil
	}
	// The controller's endpoint has its own test.
	on := []string{"--set", "agent.metricsAuth.enabled=true", "--set", "metrics.serviceMonitor.enabled=true",
		"--set", "controller.metricsAuth.enabled=false"}

	// Self-signed certificates, which nothing can verify, and no word
	// from the admin: refused, saying what to set.
	if out, stderr, err := helmTemplate(t, on...); err == nil {
		if strings.Contains(out, "insecureSkipVerify: true") {
			t.Error("by default with metricsAuth the ServiceMonitor scrapes the agents without verifying their certificates")
		} else {
			t.Error("self-signed agent certificates with a ServiceMonitor that verifies them: rendered, but no scrape can succeed")
		}
	} else {
		for _, w := range []string{"agent.metricsAuth.certSecret", "metrics.serviceMonitor.agentTLS.ca", "metrics.serviceMonitor.agentTLS.insecureSkipVerify"} {
			must(t, strings.Contains(stderr, w), "the refusal does not name %s:\n%s", w, stderr)
		}
	}

	// A certificate Secret: verified, against the name of the agents'
	// metrics Service unless the admin names another.
	tls := agentEndpoint(render(t, append(on, "--set", "agent.metricsAuth.certSecret=agent-metrics-tls")...))
	_, skip := tls["insecureSkipVerify"]
	must(t, !skip, "with a certificate Secret the ServiceMonitor says insecureSkipVerify: %v", tls)
	must(t, tls["serverName"] == "mptcp-agent-metrics.mptcp-system.svc", "serverName %v, want the agents' metrics Service's name", tls["serverName"])

	tls = agentEndpoint(render(t, append(on, "--set", "agent.metricsAuth.certSecret=agent-metrics-tls",
		"--set", "metrics.serviceMonitor.agentTLS.ca.secret.name=agent-metrics-ca", "--set", "metrics.serviceMonitor.agentTLS.ca.secret.key=ca.crt",
		"--set", "metrics.serviceMonitor.agentTLS.serverName=agents.metrics.example")...))
	_, skip = tls["insecureSkipVerify"]
	must(t, !skip, "with a CA the ServiceMonitor says insecureSkipVerify: %v", tls)
	ca, _, _ := unstructured.NestedStringMap(tls, "ca", "secret")
	must(t, ca["name"] == "agent-metrics-ca" && ca["key"] == "ca.crt", "the CA is %v, want the Secret agent-metrics-ca's ca.crt", tls["ca"])
	must(t, tls["serverName"] == "agents.metrics.example", "serverName %v, want the one given", tls["serverName"])

	// Only the admin's explicit choice skips verification.
	tls = agentEndpoint(render(t, append(on, "--set", "metrics.serviceMonitor.agentTLS.insecureSkipVerify=true")...))
	must(t, tls["insecureSkipVerify"] == true, "insecureSkipVerify set by the admin is not rendered: %v", tls)
}

// The controller's /metrics needs a token the API server authorizes, by
// default: the chart lets the controller review tokens, serves the
// certificate Secret it is given, names the Service's port for the
// ServiceMonitor's HTTPS endpoint, and the ServiceMonitor scrapes both
// components whether either has authentication or not.
func controllerMetricsNeedAuthorizedTokensByDefault(t *testing.T) {
	controllerOf := func(r *rendered) corev1.Container {
		return container(t, get[*appsv1.Deployment](t, r, "Deployment", "mptcp-controller").Spec.Template.Spec, "controller")
	}
	endpoints := func(r *rendered) map[string]map[string]any {
		sm := get[*unstructured.Unstructured](t, r, "ServiceMonitor", "mptcp-operator")
		list, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
		out := map[string]map[string]any{}
		for _, e := range list {
			m, _ := e.(map[string]any)
			out[m["port"].(string)] = m
		}
		return out
	}

	def := render(t)
	c := controllerOf(def)
	must(t, !slices.Contains(c.Args, "--metrics-auth=false"), "the controller's metrics are open by default: %v", c.Args)
	b := get[*rbacv1.ClusterRoleBinding](t, def, "ClusterRoleBinding", "mptcp-controller-metrics-auth")
	must(t, b.RoleRef.Name == "system:auth-delegator" && len(b.Subjects) == 1 && b.Subjects[0].Name == "mptcp-controller",
		"the controller may not review tokens: %+v", b)
	must(t, def.has("ClusterRole", "mptcp-metrics-reader"), "no role to let a scraper read the controller's metrics")
	svc := get[*corev1.Service](t, def, "Service", "mptcp-controller-metrics")
	must(t, len(svc.Spec.Ports) == 1 && svc.Spec.Ports[0].Name == "https-ctrl", "Service ports %+v", svc.Spec.Ports)

	withCert := render(t, "--set", "controller.metricsAuth.certSecret=controller-metrics-tls")
	c = controllerOf(withCert)
	dir, _ := flagValue(c.Args, "--metrics-cert-dir")
	m, ok := mount(c, "metrics-tls")
	must(t, ok && dir != "" && m.MountPath == dir && m.ReadOnly, "the certificate is mounted at %+v, the controller reads %q", m, dir)
	v, ok := volume(get[*appsv1.Deployment](t, withCert, "Deployment", "mptcp-controller").Spec.Template.Spec, "metrics-tls")
	must(t, ok && v.Secret != nil && v.Secret.SecretName == "controller-metrics-tls", "volume %+v is not the Secret", v)

	off := render(t, "--set", "controller.metricsAuth.enabled=false", "--set", "agent.metricsAuth.enabled=false")
	must(t, slices.Contains(controllerOf(off).Args, "--metrics-auth=false"), "controller.metricsAuth.enabled=false: args %v", controllerOf(off).Args)
	must(t, !off.has("ClusterRoleBinding", "mptcp-controller-metrics-auth"), "the controller may review tokens without metricsAuth")
	svc = get[*corev1.Service](t, off, "Service", "mptcp-controller-metrics")
	must(t, svc.Spec.Ports[0].Name == "metrics", "controller.metricsAuth.enabled=false: Service ports %+v", svc.Spec.Ports)

	// The ServiceMonitor, each component with authentication or not.
	monitor := []string{"--set", "metrics.serviceMonitor.enabled=true",
		"--set", "agent.metricsAuth.certSecret=agent-metrics-tls", "--set", "controller.metricsAuth.certSecret=controller-metrics-tls"}
	for name, c := range map[string]struct {
		set  []string
		want []string // ports scraped
	}{
		"both authenticated":  {want: []string{"https-ctrl", "https-metrics"}},
		"neither":             {set: []string{"agent.metricsAuth.enabled=false", "controller.metricsAuth.enabled=false"}, want: []string{"metrics"}},
		"the agents only":     {set: []string{"controller.metricsAuth.enabled=false"}, want: []string{"https-metrics", "metrics"}},
		"the controller only": {set: []string{"agent.metricsAuth.enabled=false"}, want: []string{"https-ctrl", "metrics"}},
	} {
		args := slices.Clone(monitor)
		for _, s := range c.set {
			args = append(args, "--set", s)
		}
		got := endpoints(render(t, args...))
		must(t, slices.Equal(slices.Sorted(maps.Keys(got)), c.want), "%s: the ServiceMonitor scrapes ports %v, want %v", name, slices.Sorted(maps.Keys(got)), c.want)
		if e, ok := got["https-ctrl"]; ok {
			tls, _ := e["tlsConfig"].(map[string]any)
			_, skip := tls["insecureSkipVerify"]
			must(t, e["scheme"] == "https" && e["bearerTokenFile"] != nil && !skip &&
				tls["serverName"] == "mptcp-controller-metrics.mptcp-system.svc",
				"%s: the controller's endpoint %v, want HTTPS with a token, verifying the controller's Service name", name, e)
		}
	}

	// A self-signed certificate and no word from the admin: refused,
	// saying what to set; the admin's explicit choice skips verification.
	selfSigned := []string{"--set", "metrics.serviceMonitor.enabled=true", "--set", "agent.metricsAuth.enabled=false"}
	if _, stderr, err := helmTemplate(t, selfSigned...); err == nil {
		t.Error("a self-signed controller certificate with a ServiceMonitor: rendered")
	} else {
		for _, w := range []string{"controller.metricsAuth.certSecret", "metrics.serviceMonitor.controllerTLS.insecureSkipVerify"} {
			must(t, strings.Contains(stderr, w), "the refusal does not name %s:\n%s", w, stderr)
		}
	}
	e := endpoints(render(t, append(selfSigned, "--set", "metrics.serviceMonitor.controllerTLS.insecureSkipVerify=true")...))["https-ctrl"]
	tls, _ := e["tlsConfig"].(map[string]any)
	must(t, tls["insecureSkipVerify"] == true, "insecureSkipVerify set by the admin is not rendered: %v", e)
}

func controllerIsANonRootLeaderElectedDeploymentWithABudget(t *testing.T) {
	r := render(t)
	d := get[*appsv1.Deployment](t, r, "Deployment", "mptcp-controller")
	spec := d.Spec.Template.Spec
	c := container(t, spec, "controller")
	must(t, d.Spec.Replicas != nil && *d.Spec.Replicas == 2, "replicas %v, want 2", d.Spec.Replicas)
	must(t, slices.Contains(c.Args, "--leader-elect"), "args %v lack --leader-elect", c.Args)
	must(t, spec.SecurityContext != nil && spec.SecurityContext.RunAsNonRoot != nil && *spec.SecurityContext.RunAsNonRoot, "the controller may run as root")
	sc := c.SecurityContext
	must(t, sc != nil && sc.ReadOnlyRootFilesystem != nil && *sc.ReadOnlyRootFilesystem, "the controller's root filesystem is writable")
	must(t, sc != nil && sc.AllowPrivilegeEscalation != nil && !*sc.AllowPrivilegeEscalation, "the controller may escalate privileges")
	must(t, sc != nil && sc.Capabilities != nil && slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) && len(sc.Capabilities.Add) == 0,
		"the controller holds capabilities: %+v", sc)
	must(t, c.LivenessProbe != nil && c.LivenessProbe.HTTPGet != nil && c.LivenessProbe.HTTPGet.Path == "/healthz", "no /healthz liveness probe")
	must(t, c.ReadinessProbe != nil && c.ReadinessProbe.HTTPGet != nil && c.ReadinessProbe.HTTPGet.Path == "/readyz", "no /readyz readiness probe")
	must(t, c.Resources.Requests.Memory().Value() > 0 && c.Resources.Limits.Memory().Value() > 0, "no memory request and limit: %+v", c.Resources)
	must(t, r.has("PodDisruptionBudget", "mptcp-controller"), "no PodDisruptionBudget for the controller")
	must(t, r.has("Role", "mptcp-controller-leader-election") && r.has("RoleBinding", "mptcp-controller-leader-election"), "no leader-election Role and RoleBinding")
	// Leader election's event ("became leader") goes through the core
	// group's events: refused without it, as a chart install showed.
	le := get[*rbacv1.Role](t, r, "Role", "mptcp-controller-leader-election")
	must(t, slices.ContainsFunc(le.Rules, func(p rbacv1.PolicyRule) bool {
		return slices.Equal(p.APIGroups, []string{""}) && slices.Equal(p.Resources, []string{"events"}) && slices.Contains(p.Verbs, "create")
	}), "the leader-election Role does not let the controller create core events: %+v", le.Rules)
}

// The ClusterRole's rules are controller-gen's, from the reconcilers' RBAC
// markers; the chart's CRDs are controller-gen's too. `make manifests`
// copies both, and they must not drift.
func crdsAndControllerRulesAreControllerGensOutput(t *testing.T) {
	bases := filepath.Join(testenv.RepoRoot(), "config", "crd", "bases")
	want, err := filepath.Glob(filepath.Join(bases, "*.yaml"))
	if err != nil || len(want) == 0 {
		t.Fatalf("no CRDs in %s: %v", bases, err)
	}
	got, err := filepath.Glob(filepath.Join(chartDir(), "crds", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Errorf("the chart has %d CRDs, config/crd/bases %d: run make manifests", len(got), len(want))
	}
	for _, w := range want {
		g := filepath.Join(chartDir(), "crds", filepath.Base(w))
		if b, err := os.ReadFile(g); err != nil || !bytes.Equal(b, readFile(t, w)) {
			t.Errorf("%s differs from %s (%v): run make manifests", g, w, err)
		}
	}

	r := render(t)
	role := get[*rbacv1.ClusterRole](t, r, "ClusterRole", "mptcp-controller")
	var generated rbacv1.ClusterRole
	if err := yaml.UnmarshalStrict(readFile(t, filepath.Join(testenv.RepoRoot(), "config", "rbac", "role.yaml")), &generated); err != nil {
		t.Fatal(err)
	}
	a, _ := json.Marshal(role.Rules)
	b, _ := json.Marshal(generated.Rules)
	if !bytes.Equal(a, b) {
		t.Errorf("the chart's controller rules\n%s\ndiffer from config/rbac/role.yaml's\n%s", a, b)
	}
}

// The admission policies match the agent's user name, which follows the
// release's namespace and the service account's name.
func agentIdentityFollowsNamespaceAndServiceAccount(t *testing.T) {
	// helmTemplate's --namespace comes first; the later one wins.
	r := render(t, "--namespace", "net-ops", "--set", "agent.serviceAccount.name=multipath-agent",
		"--set", "controller.serviceAccount.name=multipath-controller")
	for name, user := range map[string]string{
		"mptcp-agent-own-node-state":    "system:serviceaccount:net-ops:multipath-agent",
		"mptcp-agent-own-node-pod-gate": "system:serviceaccount:net-ops:multipath-agent",
		"mptcp-agent-own-node-events":   "system:serviceaccount:net-ops:multipath-agent",
	} {
		p := get[*admissionregistrationv1.ValidatingAdmissionPolicy](t, r, "ValidatingAdmissionPolicy", name)
		if len(p.Spec.MatchConditions) != 1 || !strings.Contains(p.Spec.MatchConditions[0].Expression, "'"+user+"'") {
			t.Errorf("%s matches %+v, want the user %s", name, p.Spec.MatchConditions, user)
		}
	}
	b := get[*rbacv1.ClusterRoleBinding](t, r, "ClusterRoleBinding", "mptcp-agent")
	if len(b.Subjects) != 1 || b.Subjects[0].Namespace != "net-ops" || b.Subjects[0].Name != "multipath-agent" {
		t.Errorf("the agent's ClusterRole is bound to %+v", b.Subjects)
	}
	ds := get[*appsv1.DaemonSet](t, r, "DaemonSet", "mptcp-agent")
	must(t, ds.Namespace == "net-ops" && ds.Spec.Template.Spec.ServiceAccountName == "multipath-agent",
		"the DaemonSet runs in %s as %s", ds.Namespace, ds.Spec.Template.Spec.ServiceAccountName)
}

// Pull secrets, pod labels and pod annotations reach the controller's and
// the agents' pods; a pod label cannot replace the chart's own, which the
// selectors need.
func podsTakePullSecretsLabelsAndAnnotations(t *testing.T) {
	r := render(t, "--set", "imagePullSecrets[0].name=regcred",
		"--set", "controller.podLabels.team=net", "--set", "agent.podLabels.team=net",
		"--set", "controller.podLabels.app\\.kubernetes\\.io/component=other",
		"--set", "controller.podAnnotations.example\\.com/owner=net", "--set", "agent.podAnnotations.example\\.com/owner=net")
	dep := get[*appsv1.Deployment](t, r, "Deployment", "mptcp-controller")
	ds := get[*appsv1.DaemonSet](t, r, "DaemonSet", "mptcp-agent")
	for name, pod := range map[string]corev1.PodTemplateSpec{"controller": dep.Spec.Template, "agent": ds.Spec.Template} {
		if got := pod.Spec.ImagePullSecrets; len(got) != 1 || got[0].Name != "regcred" {
			t.Errorf("%s pods pull with %+v, want regcred", name, got)
		}
		if pod.Labels["team"] != "net" || pod.Labels["app.kubernetes.io/component"] != name {
			t.Errorf("%s pods are labelled %v, want team=net beside the chart's component=%s", name, pod.Labels, name)
		}
		if pod.Annotations["example.com/owner"] != "net" {
			t.Errorf("%s pods are annotated %v", name, pod.Annotations)
		}
	}
	must(t, dep.Spec.Selector.MatchLabels["app.kubernetes.io/component"] == "controller", "the controller's selector %v", dep.Spec.Selector.MatchLabels)
}

// What admins set on any chart: labels on every object, annotations on the
// service accounts (a cloud's workload identity), and the controller's
// security contexts as their platform wants them (OpenShift's restricted
// profile assigns a UID of its own range).
func commonLabelsAccountAnnotationsAndSecurityContexts(t *testing.T) {
	r := render(t, "-f", everythingValues(), "--set", "commonLabels.team=net",
		"--set", "controller.serviceAccount.annotations.example\\.com/role=controller",
		"--set", "agent.serviceAccount.annotations.example\\.com/role=agent",
		"--set", "controller.podSecurityContext.runAsNonRoot=true", "--set", "controller.podSecurityContext.runAsUser=1000700000",
		"--set", "controller.securityContext.capabilities=null", "--set", "controller.securityContext.runAsGroup=1000700000")
	for _, k := range r.order {
		if strings.HasPrefix(k, "CustomResourceDefinition/") {
			continue // crds/ is not templated: Helm installs it as it is
		}
		var meta struct {
			Metadata metav1.ObjectMeta `json:"metadata"`
		}
		must(t, yaml.Unmarshal(r.raw[k], &meta) == nil, "%s", k)
		must(t, meta.Metadata.Labels["team"] == "net", "%s is labelled %v, without commonLabels' team=net", k, meta.Metadata.Labels)
	}
	dep := get[*appsv1.Deployment](t, r, "Deployment", "mptcp-controller")
	ds := get[*appsv1.DaemonSet](t, r, "DaemonSet", "mptcp-agent")
	for name, w := range map[string]struct {
		pod      corev1.PodTemplateSpec
		selector map[string]string
	}{"controller": {dep.Spec.Template, dep.Spec.Selector.MatchLabels}, "agent": {ds.Spec.Template, ds.Spec.Selector.MatchLabels}} {
		must(t, w.pod.Labels["team"] == "net", "%s pods are labelled %v", name, w.pod.Labels)
		_, selects := w.selector["team"]
		must(t, !selects, "the %s's selector %v takes commonLabels: changing them would orphan its pods", name, w.selector)
		sa := get[*corev1.ServiceAccount](t, r, "ServiceAccount", "mptcp-"+name)
		must(t, sa.Annotations["example.com/role"] == name, "the %s's ServiceAccount is annotated %v", name, sa.Annotations)
	}
	psc := dep.Spec.Template.Spec.SecurityContext
	must(t, psc != nil && psc.RunAsUser != nil && *psc.RunAsUser == 1000700000 && psc.SeccompProfile != nil,
		"the controller pod's security context %+v is not the chart's with the values' merged in", psc)
	csc := container(t, dep.Spec.Template.Spec, "controller").SecurityContext
	must(t, csc != nil && csc.RunAsGroup != nil && *csc.RunAsGroup == 1000700000 && csc.Capabilities == nil && csc.ReadOnlyRootFilesystem != nil,
		"the controller container's security context %+v is not the chart's with the values' merged in, capabilities dropped", csc)

	// Without them (values of a release older than these keys, or null),
	// the chart's own; a key the chart sets itself is refused.
	dep = get[*appsv1.Deployment](t, render(t, "--set", "controller.podSecurityContext=null", "--set", "controller.securityContext=null"),
		"Deployment", "mptcp-controller")
	psc, csc = dep.Spec.Template.Spec.SecurityContext, container(t, dep.Spec.Template.Spec, "controller").SecurityContext
	must(t, psc != nil && psc.RunAsNonRoot != nil && *psc.RunAsNonRoot && psc.SeccompProfile != nil, "default pod security context %+v", psc)
	must(t, csc != nil && csc.ReadOnlyRootFilesystem != nil && *csc.ReadOnlyRootFilesystem && csc.Capabilities != nil,
		"default container security context %+v", csc)
	_, stderr, err := helmTemplate(t, "--set", "commonLabels.app\\.kubernetes\\.io/name=mine")
	must(t, err != nil && strings.Contains(stderr, "commonLabels: app.kubernetes.io/name is a label the chart sets itself"),
		"a commonLabels key of the chart's own: %v %s", err, stderr)
}

func optionalPartsRenderOnlyWhenAsked(t *testing.T) {
	defaults := render(t)
	for _, k := range []string{"ServiceMonitor/mptcp-operator", "PrometheusRule/mptcp-operator", "ConfigMap/mptcp-operator-dashboard",
		"MPTCPPath/fabric-a", "MPTCPPolicy/spread-fabrics"} {
		must(t, !defaults.has(strings.Split(k, "/")[0], strings.Split(k, "/")[1]), "%s is rendered by default", k)
	}
	must(t, defaults.has("Service", "mptcp-controller-metrics") && defaults.has("Service", "mptcp-agent-metrics"), "no metrics Services by default")

	all := render(t, "-f", everythingValues())
	sm := get[*unstructured.Unstructured](t, all, "ServiceMonitor", "mptcp-operator")
	must(t, sm.GetAPIVersion() == "monitoring.coreos.com/v1", "ServiceMonitor apiVersion %s", sm.GetAPIVersion())
	must(t, sm.GetLabels()["release"] == "prometheus", "ServiceMonitor labels %v lack the values' release=prometheus", sm.GetLabels())
	// The alerts and the dashboard are the chart's files, whole: the e2e
	// evaluates those files against a real Prometheus.
	rule := get[*unstructured.Unstructured](t, all, "PrometheusRule", "mptcp-operator")
	must(t, rule.GetLabels()["release"] == "prometheus", "PrometheusRule labels %v lack the values' release=prometheus", rule.GetLabels())
	var alerts map[string]any
	must(t, yaml.Unmarshal(readChartFile(t, "files/alerts.yaml"), &alerts) == nil, "files/alerts.yaml is not YAML")
	spec, _, _ := unstructured.NestedMap(rule.Object, "spec")
	must(t, reflect.DeepEqual(spec, alerts), "the PrometheusRule's spec is not files/alerts.yaml: %v", spec)
	dash := get[*corev1.ConfigMap](t, all, "ConfigMap", "mptcp-operator-dashboard")
	must(t, dash.Namespace == "monitoring" && dash.Labels["grafana_dashboard"] == "1", "dashboard ConfigMap in %q labelled %v", dash.Namespace, dash.Labels)
	must(t, dash.Data["mptcp-operator.json"] == strings.TrimRight(string(readChartFile(t, "files/dashboard.json")), "\n"), "the dashboard ConfigMap does not hold files/dashboard.json")
	policy := get[*mptcpv1alpha1.MPTCPPolicy](t, all, "MPTCPPolicy", "spread-fabrics")
	must(t, policy.Spec.MaxSubflows == 4, "the policy's spec is not rendered as given: %+v", policy.Spec)
	path := get[*mptcpv1alpha1.MPTCPPath](t, all, "MPTCPPath", "fabric-b")
	must(t, path.Labels["fabric"] == "b", "the path's own labels are lost: %v", path.Labels)

	for _, obj := range []struct {
		kind, name, container string
	}{{"DaemonSet", "mptcp-agent", "agent"}, {"Deployment", "mptcp-controller", "controller"}} {
		var spec corev1.PodSpec
		switch o := all.objects[key(obj.kind, obj.name)].(type) {
		case *appsv1.DaemonSet:
			spec = o.Spec.Template.Spec
		case *appsv1.Deployment:
			spec = o.Spec.Template.Spec
		}
		c := container(t, spec, obj.container)
		host, _ := envValue(c, "KUBERNETES_SERVICE_HOST")
		port, _ := envValue(c, "KUBERNETES_SERVICE_PORT")
		must(t, host == "10.0.0.1" && port == "6443", "%s reaches the API server at %q:%q, want 10.0.0.1:6443", obj.name, host, port)
	}
	d := get[*appsv1.Deployment](t, all, "Deployment", "mptcp-controller")
	img := container(t, d.Spec.Template.Spec, "controller").Image
	must(t, strings.HasSuffix(img, "@sha256:0000000000000000000000000000000000000000000000000000000000000000"), "a digest does not pin the image: %s", img)
}

// The chart's default images are the ones `make images` builds and tags
// with the chart's appVersion.
func defaultImagesAreWhatMakeImagesBuilds(t *testing.T) {
	var chart struct {
		AppVersion string `json:"appVersion"`
	}
	if err := yaml.Unmarshal(readFile(t, filepath.Join(chartDir(), "Chart.yaml")), &chart); err != nil {
		t.Fatal(err)
	}
	r := render(t)
	ds := get[*appsv1.DaemonSet](t, r, "DaemonSet", "mptcp-agent")
	d := get[*appsv1.Deployment](t, r, "Deployment", "mptcp-controller")
	for name, got := range map[string]string{
		"agent":      container(t, ds.Spec.Template.Spec, "agent").Image,
		"controller": container(t, d.Spec.Template.Spec, "controller").Image,
	} {
		want := "ghcr.io/mptcp-operator/" + name + ":" + chart.AppVersion
		must(t, got == want, "%s image %s, want %s", name, got, want)
	}
}

// global.imageRegistry moves every image the chart names to one registry:
// the controller's, the agent's (also the preload image the controller
// is told), the conformance pod's and its traffic image, whether the
// repository names a registry or not; tags and digests stay. A value that
// is not a registry is refused by the schema.
func oneRegistryValueMovesEveryImage(t *testing.T) {
	const mirror = "mirror.example.com:5000/cache"
	digest := "sha256:" + strings.Repeat("a", 64)
	r := render(t, "--set", "global.imageRegistry="+mirror, "--set", "agent.image.repository=mptcp/agent",
		"--set", "controller.image.digest="+digest, "--set", "tests.image.repository=localhost/conformance")
	ds := get[*appsv1.DaemonSet](t, r, "DaemonSet", "mptcp-agent")
	d := get[*appsv1.Deployment](t, r, "Deployment", "mptcp-controller")
	pod := get[*corev1.Pod](t, r, "Pod", "mptcp-conformance")
	controller := container(t, d.Spec.Template.Spec, "controller")
	preload, _ := flagValue(controller.Args, "--preload-image")
	traffic, _ := flagValue(pod.Spec.Containers[0].Args, "-conformance.traffic-image")
	for what, got := range map[string]string{
		"agent":         container(t, ds.Spec.Template.Spec, "agent").Image,
		"preload":       preload,
		"controller":    controller.Image,
		"conformance":   pod.Spec.Containers[0].Image,
		"traffic image": traffic,
	} {
		want := map[string]string{
			"agent": mirror + "/mptcp/agent:", "preload": mirror + "/mptcp/agent:",
			"controller": mirror + "/mptcp-operator/controller:", "conformance": mirror + "/conformance:",
			"traffic image": mirror + "/mptcp-operator/traffic:",
		}[what]
		must(t, strings.HasPrefix(got, want), "%s image %q, want it from %q", what, got, want)
	}
	must(t, strings.HasSuffix(controller.Image, "@"+digest), "controller image %q lost its digest", controller.Image)
	_, stderr, err := helmTemplate(t, "--set", "global.imageRegistry=https://mirror.example.com")
	must(t, err != nil && strings.Contains(stderr, "imageRegistry"),
		"a registry with a scheme was not refused by the schema naming imageRegistry: %v\n%s", err, stderr)
}

// The pod webhook (podMPTCP.transparent): by default the controller serves
// it with a certificate it issues into the chart's empty Secret, for pods
// of namespaces that opt in only (never the release's or kube-system),
// failing open; its init container runs the agent's image. With
// cert-manager, cert-manager issues the certificate and injects the CA,
// and the controller only reads the Secret. Off, nothing of it renders.
func webhookRendersForOptedInNamespacesAndFailsOpen(t *testing.T) {
	r := render(t)
	hook := get[*admissionregistrationv1.MutatingWebhookConfiguration](t, r, "MutatingWebhookConfiguration", "mptcp-transparent")
	must(t, len(hook.Webhooks) == 1, "%d webhooks", len(hook.Webhooks))
	w := hook.Webhooks[0]
	must(t, *w.FailurePolicy == admissionregistrationv1.Ignore && *w.SideEffects == admissionregistrationv1.SideEffectClassNone, "failurePolicy %s, sideEffects %s", *w.FailurePolicy, *w.SideEffects)
	must(t, w.ClientConfig.Service != nil && w.ClientConfig.Service.Name == "mptcp-webhook" && *w.ClientConfig.Service.Path == "/mutate-v1-pod", "clientConfig %+v", w.ClientConfig)
	sel, err := metav1.LabelSelectorAsSelector(w.NamespaceSelector)
	if err != nil {
		t.Fatal(err)
	}
	for ns, want := range map[string]bool{"apps": true, "mptcp-system": false, "kube-system": false} {
		l := labels.Set{"kubernetes.io/metadata.name": ns, "mptcp.io/transparent": "enabled"}
		must(t, sel.Matches(l) == want, "namespace %s labelled for the webhook: called %v, want %v", ns, sel.Matches(l), want)
	}
	must(t, !sel.Matches(labels.Set{"kubernetes.io/metadata.name": "apps"}), "a namespace that did not opt in is called")
	must(t, r.has("Secret", "mptcp-webhook-cert") && r.has("ClusterRole", "mptcp-controller-webhook") && r.has("Service", "mptcp-webhook"), "the Secret, the Service or the caBundle's RBAC is missing")
	role := get[*rbacv1.Role](t, r, "Role", "mptcp-controller-webhook-cert")
	must(t, slices.Equal(role.Rules[0].ResourceNames, []string{"mptcp-webhook-cert"}), "the controller may touch Secrets %v", role.Rules[0].ResourceNames)

	d := get[*appsv1.Deployment](t, r, "Deployment", "mptcp-controller")
	args := strings.Join(container(t, d.Spec.Template.Spec, "controller").Args, " ")
	ds := get[*appsv1.DaemonSet](t, r, "DaemonSet", "mptcp-agent")
	agentImage := container(t, ds.Spec.Template.Spec, "agent").Image
	for _, want := range []string{"--webhook-port=9443", "--webhook-issue-cert=true", "--preload-image=" + agentImage, "--webhook-configuration=mptcp-transparent"} {
		must(t, strings.Contains(args, want), "controller args %q lack %q", args, want)
	}

	cm := render(t, "--set", "webhook.certManager.enabled=true")
	hook = get[*admissionregistrationv1.MutatingWebhookConfiguration](t, cm, "MutatingWebhookConfiguration", "mptcp-transparent")
	must(t, hook.Annotations["cert-manager.io/inject-ca-from"] == "mptcp-system/mptcp-webhook", "inject-ca-from %q", hook.Annotations["cert-manager.io/inject-ca-from"])
	cert := get[*unstructured.Unstructured](t, cm, "Certificate", "mptcp-webhook")
	secretName, _, _ := unstructured.NestedString(cert.Object, "spec", "secretName")
	must(t, secretName == "mptcp-webhook-cert" && cm.has("Issuer", "mptcp-webhook"), "Certificate's secret %q, Issuer rendered %v", secretName, cm.has("Issuer", "mptcp-webhook"))
	must(t, !cm.has("Secret", "mptcp-webhook-cert") && !cm.has("ClusterRole", "mptcp-controller-webhook"), "with cert-manager the chart still renders its Secret or the caBundle's RBAC")
	d = get[*appsv1.Deployment](t, cm, "Deployment", "mptcp-controller")
	must(t, slices.Contains(container(t, d.Spec.Template.Spec, "controller").Args, "--webhook-issue-cert=false"), "with cert-manager the controller still issues")

	off := render(t, "--set", "webhook.enabled=false")
	must(t, !off.has("MutatingWebhookConfiguration", "mptcp-transparent") && !off.has("Service", "mptcp-webhook"), "webhook.enabled=false still renders the webhook")
	d = get[*appsv1.Deployment](t, off, "Deployment", "mptcp-controller")
	must(t, !strings.Contains(strings.Join(container(t, d.Spec.Template.Spec, "controller").Args, " "), "--webhook"), "webhook.enabled=false still passes webhook flags")
}

// webhook.clientAuth.caSecret mounts that Secret's ca.crt (alone, read
// only) where -webhook-client-ca reads it, with -webhook-client-names when
// names are given; off (the default, or without the webhook), neither the
// flags nor the volume appear. Names without a CA are refused, saying so.
func webhookClientAuthMountsTheCAOnlyWhenSet(t *testing.T) {
	controllerOf := func(r *rendered) (corev1.PodSpec, corev1.Container) {
		spec := get[*appsv1.Deployment](t, r, "Deployment", "mptcp-controller").Spec.Template.Spec
		return spec, container(t, spec, "controller")
	}
	off := func(name string, r *rendered) {
		spec, c := controllerOf(r)
		_, ca := flagValue(c.Args, "--webhook-client-ca")
		_, names := flagValue(c.Args, "--webhook-client-names")
		_, mounted := mount(c, "webhook-client-ca")
		_, vol := volume(spec, "webhook-client-ca")
		must(t, !ca && !names && !mounted && !vol, "%s: client CA flags %v, mounted %v, volume %v; want none", name, c.Args, mounted, vol)
	}
	off("by default", render(t))
	off("without the webhook", render(t, "--set", "webhook.enabled=false", "--set", "webhook.clientAuth.caSecret=apiserver-webhook-ca"))

	for name, c := range map[string]struct {
		set   []string
		names string // -webhook-client-names; empty: absent
	}{
		"any name":               {},
		"allowed names":          {set: []string{"webhook.clientAuth.allowedNames={kube-apiserver-webhook-client,system:apiserver}"}, names: "kube-apiserver-webhook-client,system:apiserver"},
		"with the metrics' cert": {set: []string{"controller.metricsAuth.certSecret=controller-metrics-tls"}},
	} {
		args := []string{"--set", "webhook.clientAuth.caSecret=apiserver-webhook-ca"}
		for _, s := range c.set {
			args = append(args, "--set", s)
		}
		spec, ctr := controllerOf(render(t, args...))
		file, _ := flagValue(ctr.Args, "--webhook-client-ca")
		m, ok := mount(ctr, "webhook-client-ca")
		must(t, ok && m.ReadOnly && file == m.MountPath+"/ca.crt", "%s: the CA is mounted at %+v, the controller reads %q", name, m, file)
		v, ok := volume(spec, "webhook-client-ca")
		must(t, ok && v.Secret != nil && v.Secret.SecretName == "apiserver-webhook-ca" &&
			len(v.Secret.Items) == 1 && v.Secret.Items[0].Key == "ca.crt" && v.Secret.Items[0].Path == "ca.crt",
			"%s: volume %+v is not the Secret's ca.crt alone", name, v)
		got, ok := flagValue(ctr.Args, "--webhook-client-names")
		must(t, got == c.names && ok == (c.names != ""), "%s: -webhook-client-names %q (given %v), want %q", name, got, ok, c.names)
		if slices.Contains(c.set, "controller.metricsAuth.certSecret=controller-metrics-tls") {
			_, ok := mount(ctr, "metrics-tls")
			_, vok := volume(spec, "metrics-tls")
			must(t, ok && vok, "%s: the metrics certificate is no longer mounted", name)
		}
	}

	if _, stderr, err := helmTemplate(t, "--set", "webhook.clientAuth.allowedNames={kube-apiserver-webhook-client}"); err == nil {
		t.Error("webhook.clientAuth.allowedNames without caSecret: rendered")
	} else {
		must(t, strings.Contains(stderr, "webhook.clientAuth.caSecret"), "the refusal does not name webhook.clientAuth.caSecret:\n%s", stderr)
	}
}

// Extra flags come after the chart's (the binaries' flag parsing lets the
// later win) and extra variables beside the chart's, in both containers;
// the controller's replicas spread over nodes by default, softly, and take
// the constraints given besides.
func extraArgsEnvAndSpreadReachThePods(t *testing.T) {
	r := render(t, "--set", "controller.extraArgs[0]=--zap-log-level=debug", "--set", "agent.extraArgs[0]=-log-level=debug",
		"--set", "controller.extraEnv[0].name=GODEBUG", "--set", "controller.extraEnv[0].value=x=1",
		"--set", "agent.extraEnv[0].name=GODEBUG", "--set", "agent.extraEnv[0].value=x=1")
	dep := get[*appsv1.Deployment](t, r, "Deployment", "mptcp-controller")
	ds := get[*appsv1.DaemonSet](t, r, "DaemonSet", "mptcp-agent")
	for name, c := range map[string]corev1.Container{"controller": dep.Spec.Template.Spec.Containers[0], "agent": ds.Spec.Template.Spec.Containers[0]} {
		want := map[string]string{"controller": "--zap-log-level=debug", "agent": "-log-level=debug"}[name]
		if len(c.Args) < 2 || c.Args[len(c.Args)-1] != want {
			t.Errorf("%s args %v, want %q last", name, c.Args, want)
		}
		if !slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "GODEBUG" && e.Value == "x=1" }) ||
			!slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name != "GODEBUG" }) {
			t.Errorf("%s env %+v, want GODEBUG=x=1 beside the chart's", name, c.Env)
		}
	}

	spread := dep.Spec.Template.Spec.TopologySpreadConstraints
	if len(spread) != 1 || spread[0].TopologyKey != "kubernetes.io/hostname" || spread[0].WhenUnsatisfiable != corev1.ScheduleAnyway ||
		spread[0].LabelSelector == nil || spread[0].LabelSelector.MatchLabels["app.kubernetes.io/component"] != "controller" {
		t.Errorf("default spread %+v, want one soft constraint by hostname on the controller's labels", spread)
	}
	off := get[*appsv1.Deployment](t, render(t, "--set", "controller.spreadAcrossNodes=false"), "Deployment", "mptcp-controller")
	if n := len(off.Spec.Template.Spec.TopologySpreadConstraints); n != 0 {
		t.Errorf("spreadAcrossNodes=false: %d constraints, want none", n)
	}
	both := get[*appsv1.Deployment](t, render(t, "-f", everythingValues()), "Deployment", "mptcp-controller")
	if n := len(both.Spec.Template.Spec.TopologySpreadConstraints); n != 2 {
		t.Errorf("spread and a zone constraint given: %d constraints, want 2", n)
	}
}

// The helm test is the conformance check as a pod, run only by `helm test`
// (a test hook, deleted when the test ends), with the traffic image and
// the release's namespace and agent port; tests.enabled=false leaves it out.
func helmTestRunsTheConformanceCheck(t *testing.T) {
	r := render(t, "--set", "tests.trafficImage.repository=registry.example.com/traffic", "--set", "agent.metricsPort=9500")
	pod := get[*corev1.Pod](t, r, "Pod", "mptcp-conformance")
	must(t, pod.Annotations["helm.sh/hook"] == "test" && strings.Contains(pod.Annotations["helm.sh/hook-delete-policy"], "hook-succeeded"),
		"the conformance pod's hook annotations: %v", pod.Annotations)
	args := strings.Join(pod.Spec.Containers[0].Args, " ")
	for _, want := range []string{"-test.run=^TestInstalledOperator$", "-conformance.kubeconfig=in-cluster",
		"-conformance.traffic-image=registry.example.com/traffic:", "-conformance.namespace=" + namespace, "-conformance.metrics-port=9500"} {
		must(t, strings.Contains(args, want), "the conformance pod's args %q lack %q", args, want)
	}
	must(t, pod.Spec.ServiceAccountName == "mptcp-conformance", "the conformance pod runs as %q", pod.Spec.ServiceAccountName)
	for _, kind := range []string{"ServiceAccount", "ClusterRole", "ClusterRoleBinding"} {
		must(t, r.has(kind, "mptcp-conformance"), "no %s for the conformance pod", kind)
	}
	off := render(t, "--set", "tests.enabled=false")
	must(t, !off.has("Pod", "mptcp-conformance"), "tests.enabled=false still renders the conformance pod")
}
