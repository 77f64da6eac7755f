package charts

import (
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
)

// readVerbs are the verbs that change nothing.
var readVerbs = []string{"get", "list", "watch"}

// hookObjects are the keys of the rendered objects that are helm hooks.
func hookObjects(t *testing.T, r *rendered) []string {
	t.Helper()
	var out []string
	for _, k := range r.order {
		m, err := meta.Accessor(r.objects[k])
		if err != nil {
			t.Fatalf("%s: %v", k, err)
		}
		if m.GetAnnotations()["helm.sh/hook"] != "" {
			out = append(out, k)
		}
	}
	return out
}

// boundRules are the rules of every Role and ClusterRole the rendered
// bindings grant to one of subjects, by binding: "ClusterRoleBinding/x"
// (cluster-wide) or "RoleBinding/ns/x". A binding whose role the chart does
// not render fails the test: its rights could not be checked.
func boundRules(t *testing.T, r *rendered, subjects ...rbacv1.Subject) map[string][]rbacv1.PolicyRule {
	t.Helper()
	grants := func(subs []rbacv1.Subject) bool {
		return slices.ContainsFunc(subs, func(s rbacv1.Subject) bool {
			return slices.ContainsFunc(subjects, func(w rbacv1.Subject) bool {
				return s.Kind == w.Kind && s.Name == w.Name && s.Namespace == w.Namespace
			})
		})
	}
	roleRules := func(ref rbacv1.RoleRef, ns string) []rbacv1.PolicyRule {
		switch ref.Kind {
		case "ClusterRole":
			if !r.has("ClusterRole", ref.Name) {
				t.Fatalf("a binding of %v grants the ClusterRole %s, which the chart does not render", subjects, ref.Name)
			}
			return get[*rbacv1.ClusterRole](t, r, "ClusterRole", ref.Name).Rules
		default:
			for _, k := range r.order {
				if role, ok := r.objects[k].(*rbacv1.Role); ok && role.Name == ref.Name && role.Namespace == ns {
					return role.Rules
				}
			}
			t.Fatalf("a binding of %v grants the Role %s/%s, which the chart does not render", subjects, ns, ref.Name)
			return nil
		}
	}
	out := map[string][]rbacv1.PolicyRule{}
	for _, k := range r.order {
		switch b := r.objects[k].(type) {
		case *rbacv1.ClusterRoleBinding:
			if grants(b.Subjects) {
				out["ClusterRoleBinding/"+b.Name] = roleRules(b.RoleRef, "")
			}
		case *rbacv1.RoleBinding:
			if grants(b.Subjects) {
				out["RoleBinding/"+b.Namespace+"/"+b.Name] = roleRules(b.RoleRef, b.Namespace)
			}
		}
	}
	return out
}

func onlyVerbs(rule rbacv1.PolicyRule, allowed []string) bool {
	return !slices.ContainsFunc(rule.Verbs, func(v string) bool { return !slices.Contains(allowed, v) })
}

// `helm test` holds no cluster-wide right to change anything: cluster-wide
// it lists nodes and (with agent.metricsAuth) gets /metrics; it creates pods
// only in the namespace the chart makes for it, labelled as policy-spread
// selects, and neither namespaces nor RBAC anywhere (the chart makes those
// as hooks). Every hook object is deleted when the test ends, passed or
// failed, unless tests.keepOnFailure keeps a failed run's pod.
func helmTestHoldsNoClusterWideWriteAndEveryHookGoes(t *testing.T) {
	var spread mptcpv1alpha1.MPTCPPolicy
	if err := yaml.UnmarshalStrict(readFile(t, "../examples/policy-spread.yaml"), &spread); err != nil {
		t.Fatal(err)
	}
	spreadNS, err := metav1.LabelSelectorAsSelector(spread.Spec.NamespaceSelector)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		auth bool
		ca   bool
	}{
		{"defaults", nil, false, false},
		{"metrics auth off", []string{"--set", "agent.metricsAuth.enabled=false"}, false, false},
		{"metrics auth on", []string{"--set", "agent.metricsAuth.enabled=true"}, true, false},
		{"metrics auth with a certificate Secret", []string{"--set", "agent.metricsAuth.enabled=true", "--set", "agent.metricsAuth.certSecret=agent-tls"}, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := render(t, tc.args...)
			if tc.args == nil {
				// The defaults as values.yaml has them.
				var values struct {
					Agent struct {
						MetricsAuth struct {
							Enabled bool `json:"enabled"`
						} `json:"metricsAuth"`
					} `json:"agent"`
				}
				if err := yaml.Unmarshal(readChartFile(t, "values.yaml"), &values); err != nil {
					t.Fatal(err)
				}
				tc.auth = values.Agent.MetricsAuth.Enabled
			}
			hooks := hookObjects(t, r)
			must(t, len(hooks) >= 5, "hook objects %v", hooks)
			for _, k := range hooks {
				m, _ := meta.Accessor(r.objects[k])
				policy := strings.Split(m.GetAnnotations()["helm.sh/hook-delete-policy"], ",")
				for _, want := range []string{"before-hook-creation", "hook-succeeded", "hook-failed"} {
					must(t, slices.Contains(policy, want), "hook %s's delete policy %v lacks %s: it would outlive a run", k, policy, want)
				}
			}

			pod := get[*corev1.Pod](t, r, "Pod", "mptcp-conformance")
			args := pod.Spec.Containers[0].Args
			testNS, ok := flagValue(args, "-conformance.test-namespace")
			if !ok {
				t.Fatalf("the check is not told which namespace to run in: %v", args)
			}
			ns := get[*corev1.Namespace](t, r, "Namespace", testNS)
			must(t, slices.Contains(hooks, key("Namespace", testNS)), "the test's namespace %s is not a test hook", testNS)
			must(t, spreadNS.Matches(labels.Set(ns.Labels)), "the test's namespace is labelled %v; examples/policy-spread.yaml selects %s", ns.Labels, spreadNS)
			must(t, ns.Labels["pod-security.kubernetes.io/enforce"] == "baseline", "the test's namespace admits privileged pods: %v", ns.Labels)

			hookSA := rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: pod.Spec.ServiceAccountName, Namespace: namespace}
			grants := boundRules(t, r, hookSA)
			for binding, rules := range grants {
				for _, rule := range rules {
					for _, res := range rule.Resources {
						if slices.Contains(rule.APIGroups, rbacv1.GroupName) || res == "namespaces" || res == "*" {
							must(t, onlyVerbs(rule, readVerbs), "%s lets the helm test %v %s", binding, rule.Verbs, res)
						}
					}
					if strings.HasPrefix(binding, "ClusterRoleBinding/") || !strings.HasPrefix(binding, "RoleBinding/"+testNS+"/") {
						// Outside its own namespace the test only reads.
						must(t, onlyVerbs(rule, readVerbs), "%s lets the helm test %v %v%v outside its namespace", binding, rule.Verbs, rule.Resources, rule.NonResourceURLs)
					}
				}
			}
			createsPods := false
			for binding, rules := range grants {
				createsPods = createsPods || strings.HasPrefix(binding, "RoleBinding/"+testNS+"/") && slices.ContainsFunc(rules, func(rule rbacv1.PolicyRule) bool {
					return slices.Contains(rule.Resources, "pods") && slices.Contains(rule.Verbs, "create")
				})
			}
			must(t, createsPods, "the helm test may not create its pods in %s: %v", testNS, grants)

			// Its pods' init containers read their own gate as the
			// namespace's default ServiceAccount.
			await := boundRules(t, r, rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: "default", Namespace: testNS})
			must(t, len(await) == 1, "the test's pods get %v", await)
			for binding, rules := range await {
				must(t, strings.HasPrefix(binding, "RoleBinding/"+testNS+"/") && len(rules) == 1 &&
					slices.Equal(rules[0].Resources, []string{"pods"}) && slices.Equal(rules[0].Verbs, []string{"get"}),
					"the test's pods get %v through %s, want get on pods of their namespace", rules, binding)
			}

			auth, _ := flagValue(args, "-conformance.metrics-auth")
			must(t, auth == map[bool]string{true: "true", false: "false"}[tc.auth], "-conformance.metrics-auth=%s, want %v", auth, tc.auth)
			reader := slices.ContainsFunc(r.order, func(k string) bool {
				b, ok := r.objects[k].(*rbacv1.ClusterRoleBinding)
				return ok && b.RoleRef.Name == "mptcp-metrics-reader" && slices.Contains(b.Subjects, hookSA)
			})
			must(t, reader == tc.auth, "the helm test may get /metrics: %v, want %v (agent.metricsAuth)", reader, tc.auth)
			ca, hasCA := flagValue(args, "-conformance.metrics-ca")
			must(t, hasCA == tc.ca, "-conformance.metrics-ca given %v, want %v", hasCA, tc.ca)
			if tc.ca {
				v, ok := volume(pod.Spec, "metrics-ca")
				must(t, ok && v.Secret != nil && v.Secret.SecretName == "agent-tls" && v.Secret.Optional != nil && *v.Secret.Optional &&
					len(v.Secret.Items) == 1 && v.Secret.Items[0].Key == "ca.crt", "the CA volume %+v: want only ca.crt of agent-tls, optional", v)
				m, ok := mount(pod.Spec.Containers[0], "metrics-ca")
				must(t, ok && strings.HasPrefix(ca, m.MountPath+"/"), "the CA %s is not where the volume is mounted (%+v)", ca, m)
				name, _ := flagValue(args, "-conformance.metrics-server-name")
				must(t, name == "mptcp-agent-metrics."+namespace+".svc", "the agents' certificate is checked for %q", name)
			}
		})
	}

	keep := render(t, "--set", "tests.keepOnFailure=true")
	for _, k := range hookObjects(t, keep) {
		m, _ := meta.Accessor(keep.objects[k])
		failed := strings.Contains(m.GetAnnotations()["helm.sh/hook-delete-policy"], "hook-failed")
		must(t, failed == (k != key("Pod", "mptcp-conformance")), "keepOnFailure: %s deleted after a failure: %v", k, failed)
	}
}

// The roles for people: reading the four kinds joins Kubernetes' view role
// and writing policies and paths its edit and admin roles (node states and
// peers are the operator's to write); the plugin's reader reads what
// `kubectl mptcp status` and explain's API steps read, and only the
// debugger Role, in the release's namespace, may exec into the agents.
func rolesForPeopleAggregateAndCoverThePlugin(t *testing.T) {
	r := render(t)
	var plurals []string
	for _, k := range r.order {
		if crd, ok := r.objects[k].(*apiextensionsv1.CustomResourceDefinition); ok {
			plurals = append(plurals, crd.Spec.Names.Plural)
		}
	}
	slices.Sort(plurals)
	must(t, len(plurals) == 4, "the chart's CRDs: %v", plurals)
	writable := []string{"mptcppaths", "mptcppolicies"}

	// covered are the resources of group mptcp.io that rules allow verb on.
	covered := func(rules []rbacv1.PolicyRule, verb string) []string {
		var out []string
		for _, rule := range rules {
			if slices.Contains(rule.APIGroups, mptcpv1alpha1.GroupVersion.Group) && slices.Contains(rule.Verbs, verb) {
				for _, res := range rule.Resources {
					if !strings.Contains(res, "/") {
						out = append(out, res)
					}
				}
			}
		}
		slices.Sort(out)
		return slices.Compact(out)
	}
	view := get[*rbacv1.ClusterRole](t, r, "ClusterRole", "mptcp-operator:view")
	must(t, view.Labels["rbac.authorization.k8s.io/aggregate-to-view"] == "true", "view role labels %v", view.Labels)
	for _, verb := range readVerbs {
		must(t, slices.Equal(covered(view.Rules, verb), plurals), "the view role may %s %v, want every kind %v", verb, covered(view.Rules, verb), plurals)
	}
	for _, rule := range view.Rules {
		must(t, onlyVerbs(rule, readVerbs), "the view role may %v %v", rule.Verbs, rule.Resources)
	}
	// Writing paths and policies changes every selected node's network:
	// it joins edit and admin only when the admin says so.
	edit := get[*rbacv1.ClusterRole](t, r, "ClusterRole", "mptcp-operator:edit")
	must(t, edit.Labels["rbac.authorization.k8s.io/aggregate-to-edit"] == "" && edit.Labels["rbac.authorization.k8s.io/aggregate-to-admin"] == "",
		"by default the edit role joins edit or admin: labels %v", edit.Labels)
	aggregated := get[*rbacv1.ClusterRole](t, render(t, "--set", "rbac.aggregateToEdit=true"), "ClusterRole", "mptcp-operator:edit")
	must(t, aggregated.Labels["rbac.authorization.k8s.io/aggregate-to-edit"] == "true" && aggregated.Labels["rbac.authorization.k8s.io/aggregate-to-admin"] == "true",
		"with rbac.aggregateToEdit the edit role's labels are %v", aggregated.Labels)
	for _, verb := range []string{"create", "update", "patch", "delete"} {
		must(t, slices.Equal(covered(edit.Rules, verb), writable), "the edit role may %s %v, want %v only", verb, covered(edit.Rules, verb), writable)
	}
	for _, rule := range append(slices.Clone(view.Rules), edit.Rules...) {
		for _, res := range rule.Resources {
			must(t, !strings.HasSuffix(res, "/status") || onlyVerbs(rule, readVerbs), "a person's role may %v %s: status is the operator's", rule.Verbs, res)
		}
	}

	reader := get[*rbacv1.ClusterRole](t, r, "ClusterRole", "mptcp-operator:plugin-reader")
	must(t, slices.Equal(covered(reader.Rules, "list"), plurals), "the plugin reader lists %v, want %v", covered(reader.Rules, "list"), plurals)
	must(t, r.has("ClusterRoleBinding", "mptcp-agent"), "no ClusterRoleBinding mptcp-agent, which the plugin reads to find the agents")
	must(t, slices.ContainsFunc(reader.Rules, func(rule rbacv1.PolicyRule) bool {
		return slices.Equal(rule.Resources, []string{"clusterrolebindings"}) && slices.Equal(rule.ResourceNames, []string{"mptcp-agent"}) && onlyVerbs(rule, readVerbs)
	}), "the plugin reader cannot read the ClusterRoleBinding mptcp-agent alone: %+v", reader.Rules)
	must(t, slices.ContainsFunc(reader.Rules, func(rule rbacv1.PolicyRule) bool {
		return slices.Equal(rule.APIGroups, []string{""}) && slices.Equal(rule.Resources, []string{"nodes"})
	}), "the plugin reader cannot read the nodes preflight checks: %+v", reader.Rules)
	for _, rule := range reader.Rules {
		must(t, onlyVerbs(rule, readVerbs), "the plugin reader may %v %v", rule.Verbs, rule.Resources)
	}
	readerNS := get[*rbacv1.Role](t, r, "Role", "mptcp-operator:plugin-reader")
	debugger := get[*rbacv1.Role](t, r, "Role", "mptcp-operator:debugger")
	must(t, readerNS.Namespace == namespace && debugger.Namespace == namespace, "the plugin's Roles are in %s and %s, want the release's", readerNS.Namespace, debugger.Namespace)
	exec := func(rules []rbacv1.PolicyRule) bool {
		return slices.ContainsFunc(rules, func(rule rbacv1.PolicyRule) bool {
			return slices.Contains(rule.Resources, "pods/exec") && slices.Contains(rule.Verbs, "create")
		})
	}
	must(t, !exec(readerNS.Rules) && !exec(reader.Rules), "the plugin reader may exec into the agents")
	must(t, exec(debugger.Rules), "the debugger may not exec into the agents: %+v", debugger.Rules)
	listsPods := func(rules []rbacv1.PolicyRule) bool {
		return slices.ContainsFunc(rules, func(rule rbacv1.PolicyRule) bool {
			return slices.Contains(rule.Resources, "pods") && slices.Contains(rule.Verbs, "list")
		})
	}
	must(t, listsPods(readerNS.Rules) && listsPods(debugger.Rules), "the plugin's Roles cannot find the agent pods")

	off := render(t, "--set", "rbac.aggregateToView=false", "--set", "rbac.pluginRoles=false")
	must(t, get[*rbacv1.ClusterRole](t, off, "ClusterRole", "mptcp-operator:view").Labels["rbac.authorization.k8s.io/aggregate-to-view"] == "",
		"with rbac.aggregateToView=false the view role still joins view")
	for _, k := range []string{"ClusterRole/mptcp-operator:plugin-reader",
		"Role/mptcp-operator:plugin-reader", "Role/mptcp-operator:debugger"} {
		kind, name, _ := strings.Cut(k, "/")
		must(t, !off.has(kind, name), "%s is rendered with the roles off", k)
	}
}

// webhook.networkPolicy lets only the given peers reach the webhook port
// of the controller's pods and leaves its other ports as they are; it is
// off by default, and on without peers the chart refuses to render (a rule
// without peers would admit every pod).
func webhookNetworkPolicyAdmitsOnlyTheGivenPeers(t *testing.T) {
	must(t, !render(t).has("NetworkPolicy", "mptcp-webhook"), "a webhook NetworkPolicy by default")
	_, stderr, err := helmTemplate(t, "--set", "webhook.networkPolicy.enabled=true")
	must(t, err != nil && strings.Contains(stderr, "webhook.networkPolicy.from"), "enabled without peers: %v\n%s", err, stderr)

	r := render(t, "--set", "webhook.networkPolicy.enabled=true", "--set", "webhook.networkPolicy.from[0].ipBlock.cidr=192.0.2.10/32")
	np := get[*networkingv1.NetworkPolicy](t, r, "NetworkPolicy", "mptcp-webhook")
	dep := get[*appsv1.Deployment](t, r, "Deployment", "mptcp-controller")
	sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
	if err != nil {
		t.Fatal(err)
	}
	must(t, np.Namespace == namespace && sel.Matches(labels.Set(dep.Spec.Template.Labels)), "the policy selects %s in %s, not the controller's pods", sel, np.Namespace)
	must(t, slices.Equal(np.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}), "policy types %v", np.Spec.PolicyTypes)
	ports := map[string]corev1.ContainerPort{}
	for _, p := range container(t, dep.Spec.Template.Spec, "controller").Ports {
		ports[p.Name] = p
	}
	for name := range ports {
		var from [][]networkingv1.NetworkPolicyPeer
		for _, rule := range np.Spec.Ingress {
			if slices.ContainsFunc(rule.Ports, func(p networkingv1.NetworkPolicyPort) bool { return p.Port != nil && p.Port.String() == name }) {
				from = append(from, rule.From)
			}
		}
		switch name {
		case "webhook":
			must(t, len(from) == 1 && len(from[0]) == 1 && from[0][0].IPBlock != nil && from[0][0].IPBlock.CIDR == "192.0.2.10/32",
				"the webhook port is reached from %+v, want 192.0.2.10/32 only", from)
		default:
			must(t, len(from) == 1 && len(from[0]) == 0, "the %s port is reached from %+v, want everyone as without the policy", name, from)
		}
	}
	must(t, len(ports) == 3, "the controller's ports %v", ports)
}
