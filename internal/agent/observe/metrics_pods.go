package observe

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mptcp-operator/mptcp-operator/internal/netnsutil"
)

// podMPTCPCollector exports, per selected pod, the kernel's MPTCP counters
// that say a connection lost its end-to-end protection: DSS checksum errors
// (data changed on its way, with dataChecksums on) and fallbacks to plain
// TCP, by reason. They are read from the pod's own network namespace at
// scrape time, so they count every connection of the pod, selected or not.
type podMPTCPCollector struct {
	src                 Source
	log                 *slog.Logger
	checksumErrors      *prometheus.Desc
	fallbacks, failures *prometheus.Desc
	readErrors          *prometheus.Desc
}

// fallbackReasons names the kernel's fallback counters (MPTcpExt in
// /proc/net/netstat) by the reason label they get. A counter this kernel
// lacks is left out.
var fallbackReasons = map[string]string{
	"MPCapableFallbackACK":    "mp_capable_ack",
	"MPCapableFallbackSYNACK": "mp_capable_syn_ack",
	"MPCapableDataFallback":   "mp_capable_data",
	"MPFallbackTokenInit":     "token_init",
	"DSSCorruptionFallback":   "dss_corruption",
	"DssFallback":             "dss",
	"InfiniteMapRx":           "infinite_map",
	"SimultConnectFallback":   "simultaneous_connect",
	"MD5SigFallback":          "md5sig",
}

func newPodMPTCPCollector(src Source, log *slog.Logger) *podMPTCPCollector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(metricsNamespace, "", name), help, labels, nil)
	}
	return &podMPTCPCollector{
		src: src,
		log: log,
		checksumErrors: d("pod_mptcp_data_checksum_errors_total", "DSS checksum failures the pod's kernel detected (MPTcpExtDataCsumErr): data that changed on its way. "+
			"Counted only where checksums are on (podMPTCP.dataChecksums, or the peer asked).", "namespace", "pod"),
		fallbacks: d("pod_mptcp_fallbacks_total", "MPTCP connections or subflows of the pod that fell back to plain TCP, by the kernel's reason (MPTcpExt counters).", "namespace", "pod", "reason"),
		failures:  d("pod_mptcp_fail_total", "MP_FAIL options the pod's kernel sent (tx) or received (rx): a checksum failure was signalled.", "namespace", "pod", "direction"),
		readErrors: d("pod_mptcp_counters_read_errors", "1 when the pod's MPTCP counters could not be read at this scrape (the pod's namespace is gone or unreadable).",
			"namespace", "pod"),
	}
}

func (c *podMPTCPCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.checksumErrors, c.fallbacks, c.failures, c.readErrors} {
		ch <- d
	}
}

func (c *podMPTCPCollector) Collect(ch chan<- prometheus.Metric) {
	for _, pod := range c.src.Pods() {
		ns, podName := podLabels(pod.Name)
		mib, err := podMPTCPCounters(pod.NetNS)
		failed := 0.0
		if err != nil {
			// One pod's namespace going away must not fail the scrape.
			c.log.Debug("reading a pod's MPTCP counters", "pod", pod.Name, "err", err)
			failed = 1
		}
		ch <- prometheus.MustNewConstMetric(c.readErrors, prometheus.GaugeValue, failed, ns, podName)
		if err != nil {
			continue
		}
		if v, ok := mib["DataCsumErr"]; ok {
			ch <- prometheus.MustNewConstMetric(c.checksumErrors, prometheus.CounterValue, v, ns, podName)
		}
		for counter, reason := range fallbackReasons {
			if v, ok := mib[counter]; ok {
				ch <- prometheus.MustNewConstMetric(c.fallbacks, prometheus.CounterValue, v, ns, podName, reason)
			}
		}
		for counter, dir := range map[string]string{"MPFailTx": "tx", "MPFailRx": "rx"} {
			if v, ok := mib[counter]; ok {
				ch <- prometheus.MustNewConstMetric(c.failures, prometheus.CounterValue, v, ns, podName, dir)
			}
		}
	}
}

// podMPTCPCounters reads the MPTcpExt counters of the network namespace at
// nsPath.
func podMPTCPCounters(nsPath string) (map[string]float64, error) {
	var mib map[string]float64
	err := netnsutil.Do(nsPath, func() error {
		// thread-self: /proc/net follows the process's first thread,
		// which stays in the agent's namespace.
		f, err := os.Open("/proc/thread-self/net/netstat")
		if err != nil {
			return err
		}
		defer f.Close()
		mib, err = parseNetstat(f, "MPTcpExt")
		return err
	})
	return mib, err
}

// parseNetstat reads the counters of one group of /proc/net/netstat: a line
// of names ("MPTcpExt: A B ...") followed by a line of values.
func parseNetstat(r io.Reader, group string) (map[string]float64, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	prefix := group + ":"
	var names []string
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 || f[0] != prefix {
			continue
		}
		if names == nil {
			names = f[1:]
			continue
		}
		if len(f)-1 != len(names) {
			return nil, fmt.Errorf("%s: %d names but %d values", group, len(names), len(f)-1)
		}
		out := make(map[string]float64, len(names))
		for i, name := range names {
			v, err := strconv.ParseFloat(f[i+1], 64)
			if err != nil {
				return nil, fmt.Errorf("%s %s: %w", group, name, err)
			}
			out[name] = v
		}
		return out, nil
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return nil, fmt.Errorf("no %s counters (is MPTCP built into this kernel?)", group)
}
