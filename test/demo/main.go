// Command demo runs the walking skeleton end to end on one machine: a test
// bed of 2 nodes x 2 NICs (network namespaces, links shaped to 200 Mbit/s),
// then, side by side in one run, single-path TCP, MPTCP left to kernel
// routing, MPTCP with hand-written policy routing, and MPTCP steered by the
// agent as a cluster runs it: a local control plane, a real kubelet and
// containerd on every node, the operator installed with its Helm chart (the
// controller and an agent per node run as the chart's pods), the policies
// of examples/, and pods run from the traffic image. It prints per-NIC and total throughput, saves the sampled NIC
// counters as CSV, draws them as an SVG chart, and tears everything down.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/mptcp-operator/mptcp-operator/test/framework"
	"github.com/mptcp-operator/mptcp-operator/test/testbed"
	"github.com/mptcp-operator/mptcp-operator/test/testbed/nodes"
)

func main() {
	out := flag.String("out", "_output/demo", "directory for the CSV and the chart")
	duration := flag.Duration("duration", 10*time.Second, "length of each transfer")
	rate := flag.String("rate", "200mbit", "rate of each NIC's link, each direction")
	conns := flag.Int("conns", 1, "concurrent connections per transfer")
	assets := flag.String("assets", os.Getenv("KUBEBUILDER_ASSETS"), "directory with kube-apiserver, etcd, kubelet, kube-controller-manager and kube-scheduler (make -s print-envtest-assets)")
	images := flag.String("images", "_output/images", "directory with the image archives and images.json of make images")
	helm := flag.String("helm", os.Getenv("HELM"), "the helm binary (make -s print-helm)")
	flag.Parse()
	if err := run(*out, *duration, *rate, *conns, *assets, *images, *helm); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func run(outDir string, duration time.Duration, rate string, conns int, assets, images, helm string) error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("needs root: it creates network namespaces and loads BPF programs (run: sudo make demo)")
	}
	if assets == "" {
		return fmt.Errorf("needs kube-apiserver and etcd: run it with make demo, which builds them, or pass -assets $(make -s print-envtest-assets)")
	}
	if helm == "" {
		return fmt.Errorf("needs helm: run it with make demo, which builds it, or pass -helm $(make -s print-helm)")
	}
	for _, tool := range append(append(testbed.BedTools, nodes.Tools...), "go") {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("needs %s on PATH (see .ci/run for the packages)", tool)
		}
	}
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return err
	}
	binDir, err := os.MkdirTemp("", "mptcp-demo-bin-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(binDir)
	fmt.Println("building the agent and the traffic tool ...")
	bins, err := framework.BuildBinaries(binDir)
	if err != nil {
		return err
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := testbed.SweepStale(); err != nil {
		fmt.Println("warning: sweeping stale beds:", err)
	}
	fmt.Printf("bringing up the test bed: 2 nodes x 2 NICs, each link %s per direction ...\n", rate)
	bed, err := testbed.Up(ctx, testbed.Config{Nodes: 2, NICs: 2, PodsPerNode: 1, LinkRate: rate})
	if err != nil {
		return err
	}
	defer func() {
		fmt.Println("tearing the test bed down ...")
		if err := bed.Down(); err != nil {
			fmt.Fprintln(os.Stderr, "demo: teardown:", err)
		}
	}()

	sampler, err := bed.StartSampler(250 * time.Millisecond)
	if err != nil {
		return err
	}
	start := time.Now()
	logf := func(format string, args ...any) { fmt.Printf(format+"\n", args...) }
	o := framework.CompareOptions{
		Binaries: bins,
		Duration: duration, Warmup: 2 * time.Second, Conns: conns,
		Log: logf, SkipAgent: true,
	}
	results, err := framework.Compare(ctx, bed, o)
	if err == nil {
		var m framework.Measurement
		if m, err = runAPIScenario(ctx, bed, o, helm, assets, images, filepath.Join(outDir, "logs")); err == nil {
			results = append(results, m)
		}
	}
	samples, serr := sampler.Stop()
	if err != nil {
		return err
	}
	if serr != nil {
		return serr
	}

	printTable(os.Stdout, results, rate)

	csvPath := filepath.Join(outDir, "nic-counters.csv")
	f, err := os.Create(csvPath)
	if err != nil {
		return err
	}
	if err := sampler.WriteCSV(f); err != nil {
		f.Close()
		return err
	}
	f.Close()
	var phases []phase
	for _, r := range results {
		phases = append(phases, phase{Name: r.Scenario, Start: r.Start, End: r.End})
	}
	svgPath := filepath.Join(outDir, "throughput.svg")
	g, err := os.Create(svgPath)
	if err != nil {
		return err
	}
	defer g.Close()
	title := fmt.Sprintf("Transmit rate of node 1's NICs (links %s each), one transfer per scenario", rate)
	if err := writeSVG(g, title, rates(samples, 1, start), phases, start); err != nil {
		return err
	}
	fmt.Printf("\nNIC counters: %s\nchart:        %s\n", csvPath, svgPath)
	return nil
}

func printTable(w *os.File, results []framework.Measurement, rate string) {
	fmt.Fprintf(w, "\nThroughput from a pod on node 1 to a pod on node 2, %d NICs of %s each:\n\n", len(results[0].NICMbps), rate)
	var single float64
	for _, r := range results {
		if r.Scenario == framework.ScenarioSinglePath {
			single = r.GoodputBps
		}
	}
	header := fmt.Sprintf("%-30s", "scenario")
	for k := range results[0].NICMbps {
		header += fmt.Sprintf("  %12s", fmt.Sprintf("nic%d Mbit/s", k+1))
	}
	fmt.Fprintf(w, "%s  %14s  %14s\n", header, "goodput Mbit/s", "vs single path")
	for _, r := range results {
		line := fmt.Sprintf("%-30s", r.Scenario)
		for _, v := range r.NICMbps {
			line += fmt.Sprintf("  %12.1f", v)
		}
		ratio := "-"
		if single > 0 {
			ratio = fmt.Sprintf("%.2fx", r.GoodputBps/single)
		}
		fmt.Fprintf(w, "%s  %14.1f  %14s\n", line, r.GoodputBps/1e6, ratio)
	}
	fmt.Fprintln(w, "\nPer-NIC columns: node 1's transmit rate over the goodput window. Goodput: what the server received.")
}

// runAPIScenario runs the agent scenario through the API, with the
// operator installed by its chart.
func runAPIScenario(ctx context.Context, bed *testbed.Bed, o framework.CompareOptions, helm, assets, images, logs string) (framework.Measurement, error) {
	o.Log("running %q for %v", ScenarioAPI, o.Duration)
	api, err := startAPI(ctx, bed, helm, assets, images, logs, o.Log)
	if err != nil {
		return framework.Measurement{}, fmt.Errorf("%s: %w (logs in %s)", ScenarioAPI, err, logs)
	}
	defer func() {
		if err := api.Close(); err != nil {
			o.Log("stopping the cluster: %v", err)
		}
	}()
	m, err := api.transfer(ctx, o.Duration, o.Warmup, o.Conns)
	api.describeNodeStates(ctx)
	if err != nil {
		return m, fmt.Errorf("%s: %w (logs in %s)", ScenarioAPI, err, logs)
	}
	return m, nil
}
