package main_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/test/testenv"
	"github.com/mptcp-operator/mptcp-operator/test/testutil"
)

// TestBinary builds and runs the real controller binary against a real API
// server: it must become ready and compile a node's state.
func TestBinary(t *testing.T) {
	env := testenv.Start(t)
	bin := filepath.Join(t.TempDir(), "controller")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Stderr = os.Stderr
	if err := build.Run(); err != nil {
		t.Fatalf("build: %v", err)
	}
	probe := "127.0.0.1:" + strconv.Itoa(testutil.FreePort(t))
	cmd := exec.Command(bin, "--kubeconfig", env.Kubeconfig(t), "--metrics-bind-address", "0",
		"--health-probe-bind-address", probe)
	logs, err := os.Create(filepath.Join(t.TempDir(), "controller.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		_ = cmd.Wait()
		if t.Failed() {
			out, _ := os.ReadFile(logs.Name())
			t.Logf("controller output:\n%s", out)
		}
	})

	testutil.Eventually(t, 30*time.Second, 100*time.Millisecond, "readyz", func() error {
		resp, err := http.Get("http://" + probe + "/readyz")
		if err != nil {
			return err
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		return nil
	})
	ctx := context.Background()
	if err := env.Client.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"},
		Spec: corev1.NodeSpec{PodCIDRs: []string{"10.1.1.0/24"}}}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 30*time.Second, 100*time.Millisecond, "node state", func() error {
		var s mptcpv1alpha1.MPTCPNodeState
		if err := env.Client.Get(ctx, types.NamespacedName{Name: "node-1"}, &s); err != nil {
			return err
		}
		if len(s.Spec.PodCIDRs) != 1 || s.Spec.PodCIDRs[0] != "10.1.1.0/24" {
			return fmt.Errorf("spec %+v", s.Spec)
		}
		return nil
	})
}
