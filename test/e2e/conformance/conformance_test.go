package conformance

import (
	"flag"
	"fmt"
	"os"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

var (
	kubeconfig   = flag.String("conformance.kubeconfig", "", "kubeconfig of a cluster with the chart installed and examples/paths.yaml and policy-spread.yaml applied; in-cluster: the pod's service account (the chart's helm test)")
	trafficImage = flag.String("conformance.traffic-image", "", "reference of the traffic image (make images) on the cluster's nodes")
	pullPolicy   = flag.String("conformance.pull-policy", string(corev1.PullNever), "pull policy of the traffic image")
	namespace    = flag.String("conformance.namespace", "mptcp-system", "the chart's release namespace")
	testNS       = flag.String("conformance.test-namespace", "", "the namespace to run the check's pods in, made with the roles they need (the chart's helm test makes one); empty: the check makes one of its own, which needs an admin's rights")
	metricsPort  = flag.Int("conformance.metrics-port", 9402, "the chart's agent.metricsPort")
	metricsAuth  = flag.Bool("conformance.metrics-auth", true, "the chart's agent.metricsAuth.enabled: the agents serve /metrics over HTTPS to authorized tokens only")
	metricsCA    = flag.String("conformance.metrics-ca", "", "a file with the CA of the agents' metrics certificate (agent.metricsAuth.certSecret); empty or missing: the agent's certificate is not verified")
	metricsName  = flag.String("conformance.metrics-server-name", "", "the name the agents' metrics certificate carries, verified with -conformance.metrics-ca")
	duration     = flag.Duration("conformance.duration", 10*time.Second, "length of the transfer")
	vm           = flag.Bool("conformance.vm", false, "run the VM case too (TestInstalledOperatorServesVMs): the cluster runs KubeVirt")
	vmImage      = flag.String("conformance.vm-image", "quay.io/containerdisks/fedora:41", "containerDisk of the VM case's VM: cloud-init, Python 3, Linux 5.16 or later")
	vmBinding    = flag.String("conformance.vm-binding", Bindings[0], fmt.Sprintf("pod network binding of the VM case's VM, one of %v", Bindings))
	dryRun       = flag.Bool("conformance.dry-run", false, "print the VM case's objects instead of creating them; needs no cluster")
)

// config is the cluster's, from -conformance.kubeconfig.
func config() (*rest.Config, error) {
	if *kubeconfig == "in-cluster" {
		return rest.InClusterConfig()
	}
	return clientcmd.BuildConfigFromFlags("", *kubeconfig)
}

func env() Env {
	cfg, err := config()
	if err != nil {
		panic(err)
	}
	return Env{Config: cfg, TrafficImage: *trafficImage, PullPolicy: corev1.PullPolicy(*pullPolicy),
		AgentNamespace: *namespace, AgentMetricsPort: *metricsPort, TestNamespace: *testNS,
		MetricsAuth: *metricsAuth, MetricsCA: *metricsCA, MetricsServerName: *metricsName, Duration: *duration}
}

func requireCluster(t *testing.T) {
	t.Helper()
	if *kubeconfig == "" || *trafficImage == "" {
		t.Skip("checks a cluster of your own: -conformance.kubeconfig=FILE -conformance.traffic-image=REF (hack/kind.sh e2e does it on kind); make test runs the same checks on the test bed's nodes in TestChartInstalledAsAnAdminDoesSpreadsAndUninstallsWithoutATrace, as the chart's helm test")
	}
	if _, err := config(); err != nil {
		t.Fatal(err)
	}
}

// The installed operator of the cluster -conformance.kubeconfig names
// spreads a pod's connections to another node over two paths and delivers
// them whole. The chart's helm test runs it in a pod (make test does so on
// the test bed's real nodes, in the chart install test); hack/kind.sh e2e
// runs it on kind.
func TestInstalledOperator(t *testing.T) {
	requireCluster(t)
	Run(t, env())
}

// The same operator gives a KubeVirt VM guest mode and carries a pod's
// connections to it over two paths, whole (vm.go). -conformance.dry-run
// prints what it would create.
func TestInstalledOperatorServesVMs(t *testing.T) {
	venv := VMEnv{Image: *vmImage, Binding: *vmBinding}
	if *dryRun {
		venv.TrafficImage, venv.Duration = *trafficImage, *duration
		out, err := DryRunVM(venv)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = os.Stdout.WriteString(out)
		return
	}
	if !*vm {
		t.Skip("checks a cluster of your own that runs KubeVirt: -conformance.vm with the flags of TestInstalledOperator; -conformance.dry-run prints the objects")
	}
	requireCluster(t)
	venv.Env = env()
	RunVM(t, venv)
}
