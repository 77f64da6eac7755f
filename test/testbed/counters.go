package testbed

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/mptcp-operator/mptcp-operator/internal/netnsutil"
	"github.com/mptcp-operator/mptcp-operator/test/testutil"
)

// NICCounters returns the bytes received and sent by nic<k> of node, as the node namespace counts them (tx is
// traffic leaving the node on that NIC).
func (b *Bed) NICCounters(node *Node, k int) (rxBytes, txBytes uint64, err error) {
	h, err := nsHandle(node.NetNS)
	if err != nil {
		return 0, 0, err
	}
	defer h.Close()
	return nicCounters(h, node.NIC(k).Name)
}

func nicCounters(h *netlink.Handle, name string) (uint64, uint64, error) {
	l, err := h.LinkByName(name)
	if err != nil {
		return 0, 0, err
	}
	s := l.Attrs().Statistics
	if s == nil {
		return 0, 0, fmt.Errorf("%s: no statistics", name)
	}
	return s.RxBytes, s.TxBytes, nil
}

// Sample is one reading of one NIC's counters.
type Sample struct {
	Time    time.Time
	Node    int
	NIC     int
	RxBytes uint64
	TxBytes uint64
}

// Sampler reads the counters of every NIC of a bed at a fixed interval.
type Sampler struct {
	mu    sync.Mutex
	rows  []Sample
	stop  chan struct{}
	done  chan struct{}
	err   error
	start time.Time
}

// StartSampler samples every NIC of every node every interval until Stop. A NIC that does not exist at a sample
// (RemoveNIC) has no row then; one created again (RestoreNIC) counts from zero.
func (b *Bed) StartSampler(interval time.Duration) (*Sampler, error) {
	handles := make([]*netlink.Handle, len(b.Nodes))
	for i, n := range b.Nodes {
		h, err := nsHandle(n.NetNS)
		if err != nil {
			for _, h := range handles[:i] {
				h.Close()
			}
			return nil, err
		}
		handles[i] = h
	}
	s := &Sampler{stop: make(chan struct{}), done: make(chan struct{}), start: time.Now()}
	sample := func() {
		now := time.Now()
		for i, n := range b.Nodes {
			for _, c := range n.NICs {
				rx, tx, err := nicCounters(handles[i], c.Name)
				if _, gone := errors.AsType[netlink.LinkNotFoundError](err); gone {
					continue // removed (RemoveNIC): no row while it is away
				}
				s.mu.Lock()
				if err != nil {
					if s.err == nil {
						s.err = err
					}
				} else {
					s.rows = append(s.rows, Sample{Time: now, Node: n.Index, NIC: c.Index, RxBytes: rx, TxBytes: tx})
				}
				s.mu.Unlock()
			}
		}
	}
	go func() {
		defer close(s.done)
		defer func() {
			for _, h := range handles {
				h.Close()
			}
		}()
		t := time.NewTicker(interval)
		defer t.Stop()
		sample()
		for {
			select {
			case <-s.stop:
				sample()
				return
			case <-t.C:
				sample()
			}
		}
	}()
	return s, nil
}

// Stop takes a last sample, stops sampling and returns all rows. It returns the first read error, if any.
func (s *Sampler) Stop() ([]Sample, error) {
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	<-s.done
	return s.Rows(), s.err
}

// Rows returns the samples taken so far.
func (s *Sampler) Rows() []Sample {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Sample(nil), s.rows...)
}

// WriteCSV writes the samples as CSV: seconds since the sampler started, node, nic, rx_bytes, tx_bytes.
func (s *Sampler) WriteCSV(w io.Writer) error {
	cw := csv.NewWriter(w)
	_ = cw.Write([]string{"t_s", "node", "nic", "rx_bytes", "tx_bytes"})
	for _, r := range s.Rows() {
		_ = cw.Write([]string{
			strconv.FormatFloat(r.Time.Sub(s.start).Seconds(), 'f', 3, 64),
			strconv.Itoa(r.Node), strconv.Itoa(r.NIC),
			strconv.FormatUint(r.RxBytes, 10), strconv.FormatUint(r.TxBytes, 10),
		})
	}
	cw.Flush()
	return cw.Error()
}

// KernelCounter reads one of the kernel's SNMP counters (as nstat names
// them: TcpRetransSegs, MPTcpExtDataCsumErr, TcpExtIPReversePathFilter) in
// namespace ns, from the namespace's own /proc/net files, read by a thread
// inside it (no command to start, none to fail under load).
func (b *Bed) KernelCounter(ns, name string) (float64, error) {
	var texts []string
	err := netnsutil.Do("/var/run/netns/"+ns, func() error {
		for _, file := range []string{"netstat", "snmp"} {
			raw, err := os.ReadFile("/proc/thread-self/net/" + file)
			if err != nil {
				return err
			}
			texts = append(texts, string(raw))
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("counter %s in %s: %w", name, ns, err)
	}
	for _, text := range texts {
		if v, ok := testutil.SNMPCounter(text, name); ok {
			return v, nil
		}
	}
	return 0, fmt.Errorf("namespace %s has no counter %s", ns, name)
}
