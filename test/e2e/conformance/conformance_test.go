package conformance

import (
	"flag"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/clientcmd"
)

var (
	kubeconfig   = flag.String("conformance.kubeconfig", "", "kubeconfig of a cluster with the chart installed and examples/paths.yaml and policy-spread.yaml applied")
	trafficImage = flag.String("conformance.traffic-image", "", "reference of the traffic image (make images) on the cluster's nodes")
	pullPolicy   = flag.String("conformance.pull-policy", string(corev1.PullNever), "pull policy of the traffic image")
	namespace    = flag.String("conformance.namespace", "mptcp-system", "the chart's release namespace")
	metricsPort  = flag.Int("conformance.metrics-port", 9402, "the chart's agent.metricsPort")
	duration     = flag.Duration("conformance.duration", 10*time.Second, "length of the transfer")
)

// The installed operator of the cluster -conformance.kubeconfig names
// spreads a pod's connections to another node over two paths and delivers
// them whole. hack/kind.sh e2e runs it on kind; make test runs Run on the
// test bed's real nodes instead, from the chart install test.
func TestInstalledOperator(t *testing.T) {
	if *kubeconfig == "" || *trafficImage == "" {
		t.Skip("checks a cluster of your own: -conformance.kubeconfig=FILE -conformance.traffic-image=REF (hack/kind.sh e2e does it on kind); make test runs the same checks on the test bed's nodes in TestChartInstalledAsAnAdminDoesSpreadsAndUninstallsWithoutATrace")
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	Run(t, Env{Config: cfg, TrafficImage: *trafficImage, PullPolicy: corev1.PullPolicy(*pullPolicy),
		AgentNamespace: *namespace, AgentMetricsPort: *metricsPort, Duration: *duration})
}
