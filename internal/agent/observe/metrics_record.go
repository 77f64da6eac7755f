package observe

import (
	"net/netip"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mptcp-operator/mptcp-operator/internal/datapath"
)

// recordCollector exports the datapath's record actor at scrape time: per
// pod address traffic, and the fill and evictions of the LRU tables.
//
// Nothing per connection is exported: a connection is named by its MPTCP
// token, and whoever knows a token can send joins that name the connection
// (RFC 8684, 3.2). The keys that complete a join stay secret, but the
// receiver's token is all a join SYN carries, and the datapath acts on join
// SYNs before any HMAC is checked (it places them and counts them against
// maxSubflows). Metrics travel to whoever scrapes them;
// per-connection detail stays behind the local API, which only root on the
// node reaches (localapi.go).
type recordCollector struct {
	src                                            Source
	podTxBytes, podTxPackets, podRxBytes, podRxPkt *prometheus.Desc
	tableEntries, tableCapacity, tableEvictions    *prometheus.Desc
	mptcpOptions, mptcpOptionsInvalid              *prometheus.Desc
}

// podAddressLabels label a pod address's traffic: its pod, and the address
// (a pod has one per family).
var podAddressLabels = []string{"namespace", "pod", "address"}

func newRecordCollector(src Source) *recordCollector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(metricsNamespace, "", name), help, labels, nil)
	}
	return &recordCollector{
		src:            src,
		podTxBytes:     d("pod_tx_bytes_total", "Bytes of TCP a selected pod address sent, counted at its host-side veth (Ethernet header included).", podAddressLabels...),
		podTxPackets:   d("pod_tx_packets_total", "TCP packets a selected pod address sent (GSO super-packets count once).", podAddressLabels...),
		podRxBytes:     d("pod_rx_bytes_total", "Bytes of TCP a selected pod address received, counted at its host-side veth.", podAddressLabels...),
		podRxPkt:       d("pod_rx_packets_total", "TCP packets a selected pod address received.", podAddressLabels...),
		tableEntries:   d("table_entries", "Live entries of a datapath table (subflows, connections, police_buckets).", "table"),
		tableCapacity:  d("table_capacity", "Capacity of a datapath table.", "table"),
		tableEvictions: d("table_evictions_total", "Entries a datapath table evicted to fit new ones (counted by the datapath; for the connection LRU, entries created minus those the agent deleted minus those live).", "table"),
		mptcpOptions: d("mptcp_options_total", "TCP packets the datapath parsed that carried a valid MPTCP option of the subtype (RFC 8684 names), once per packet and subtype: "+
			"everything the selected pods' veths and the path NICs carry, selected or not.", "subtype"),
		mptcpOptionsInvalid: d("mptcp_options_invalid_total", "TCP packets that carried an MPTCP option of the subtype with a length RFC 8684 does not define for it: "+
			"the datapath ignored the option, as the receiver does.", "subtype"),
	}
}

func (c *recordCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.podTxBytes, c.podTxPackets, c.podRxBytes, c.podRxPkt, c.tableEntries, c.tableCapacity, c.tableEvictions,
		c.mptcpOptions, c.mptcpOptionsInvalid} {
		ch <- d
	}
}

func (c *recordCollector) Collect(ch chan<- prometheus.Metric) {
	dp := c.src.Datapath()
	if pods, err := dp.PodStats(); err != nil {
		ch <- prometheus.NewInvalidMetric(c.podTxBytes, err)
	} else {
		owners := map[netip.Addr]string{}
		for _, p := range c.src.Pods() {
			for _, ip := range p.IPs {
				owners[ip] = p.Name
			}
		}
		for addr, p := range pods {
			// An address no pod holds now (its counters outlive the
			// pod until its slot is reused) has empty pod labels.
			ns, pod := podLabels(owners[addr])
			labels := []string{ns, pod, addr.String()}
			ch <- prometheus.MustNewConstMetric(c.podTxBytes, prometheus.CounterValue, float64(p.TxBytes), labels...)
			ch <- prometheus.MustNewConstMetric(c.podTxPackets, prometheus.CounterValue, float64(p.TxPackets), labels...)
			ch <- prometheus.MustNewConstMetric(c.podRxBytes, prometheus.CounterValue, float64(p.RxBytes), labels...)
			ch <- prometheus.MustNewConstMetric(c.podRxPkt, prometheus.CounterValue, float64(p.RxPackets), labels...)
		}
	}
	c.collectOptions(ch)
	tables, err := dp.Occupancy()
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.tableEntries, err)
		return
	}
	for table, o := range tables {
		ch <- prometheus.MustNewConstMetric(c.tableEntries, prometheus.GaugeValue, float64(o.Entries), table)
		ch <- prometheus.MustNewConstMetric(c.tableCapacity, prometheus.GaugeValue, float64(o.Capacity), table)
		ch <- prometheus.MustNewConstMetric(c.tableEvictions, prometheus.CounterValue, float64(o.Evictions), table)
	}
}

// collectOptions exports the per-subtype counters: every subtype RFC 8684
// names, and any other value of the 4-bit field once a packet carried it
// (so an unassigned subtype on the wire shows, without 12 series of zeros).
func (c *recordCollector) collectOptions(ch chan<- prometheus.Metric) {
	opts, err := c.src.Datapath().MPTCPOptionStats()
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.mptcpOptions, err)
		return
	}
	for i, o := range opts {
		st := datapath.MPTCPSubtype(i)
		if !st.Named() && o.Packets == 0 && o.Invalid == 0 {
			continue
		}
		ch <- prometheus.MustNewConstMetric(c.mptcpOptions, prometheus.CounterValue, float64(o.Packets), st.String())
		ch <- prometheus.MustNewConstMetric(c.mptcpOptionsInvalid, prometheus.CounterValue, float64(o.Invalid), st.String())
	}
}
