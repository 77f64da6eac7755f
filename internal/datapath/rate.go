package datapath

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"net/netip"
	"time"

	"github.com/mptcp-operator/mptcp-operator/internal/limits"
)

// RateMode is how the rate actor enforces a rule's caps (bpf/include/rate.h).
type RateMode uint32

// The modes; the values are enum rate_mode of bpf/include/rate.h.
const (
	// RateWindow lowers the receive window of the ACKs a pod sends, so the
	// peer sends the pod no faster than the cap (per connection).
	RateWindow = RateMode(datapathRateModeRATE_MODE_WINDOW)
	// RatePolice drops what exceeds a token bucket, per connection, pod
	// and path, in the directions asked for.
	RatePolice = RateMode(datapathRateModeRATE_MODE_POLICE)
	// RateShape classifies a pod's packets at the path NIC's egress into an
	// HTB class the agent owns; HTB holds the rate.
	RateShape = RateMode(datapathRateModeRATE_MODE_SHAPE)
)

func (m RateMode) String() string {
	switch m {
	case RateWindow:
		return "window"
	case RatePolice:
		return "police"
	case RateShape:
		return "shape"
	}
	return fmt.Sprintf("RateMode(%d)", uint32(m))
}

// Direction says which traffic of a pod police caps.
type Direction uint32

// Directions, as the flags of struct rate_cfg.
const (
	// Egress is what the pod sends (pod_egress).
	Egress = Direction(datapathRateFlagRATE_POLICE_EGRESS)
	// Ingress is what the pod receives (pod_ingress).
	Ingress = Direction(datapathRateFlagRATE_POLICE_INGRESS)
)

// Flags of struct rate_cfg besides the directions (enum rate_flag).
const (
	rateHeadersMayBeRewritten = uint32(datapathRateFlagRATE_HEADERS_MAY_BE_REWRITTEN)
	rateCoarseClock           = uint32(datapathRateFlagRATE_COARSE_CLOCK)
	rateBudget                = uint32(datapathRateFlagRATE_BUDGET)
	rateNamespace             = uint32(datapathRateFlagRATE_NAMESPACE)
)

// coarseClockMinDepth is the shallowest police bucket, in time at its rate,
// that may be timed with the kernel's coarse clock (bpf_ktime_get_coarse_ns,
// updated once per scheduler tick: 4 ms at HZ=250, 10 ms at HZ=100). A clock
// a tick behind makes a bucket look up to a tick fuller than it is, so it
// lets through up to a tick less of a burst; the rate it holds is the same.
// Reading it costs a fraction of the precise clock (docs/benchmarks.md), and
// police reads a clock on every packet with data. The default depth is
// 200 ms (DefaultBurst).
const coarseClockMinDepth = 100 * time.Millisecond

// coarseClockFits says whether every bucket of c is at least
// coarseClockMinDepth deep at its rate.
func coarseClockFits(c RateConfig, burst uint64) bool {
	fits := func(bps uint64) bool {
		return bps == 0 || float64(burst)*8/float64(bps) >= coarseClockMinDepth.Seconds()
	}
	if !fits(c.PerConnection) || !fits(c.PerPod) || !fits(c.PerNamespace) {
		return false
	}
	for _, r := range c.PerPath {
		if !fits(r) {
			return false
		}
	}
	return true
}

// MinBurstBytes is the smallest bucket (and window grant) the datapath
// accepts: below a few 64 KiB GSO segments, a police bucket drops whole TSO
// bursts and TCP collapses far below the cap (docs/datapath.md, Rate).
// MaxBurstBytes bounds what a connection may send at once.
const (
	MinBurstBytes = limits.MinBurstBytes
	MaxBurstBytes = limits.MaxBurstBytes
)

// RateConfig is one rule's rate caps, in bits per second (0: no cap).
type RateConfig struct {
	Mode          RateMode
	PerConnection uint64
	PerPod        uint64
	// PerNamespace caps the pods of each namespace on this node together
	// (police: the bucket SyncPodNamespaces names; shape: the namespace's
	// HTB class, the agent's).
	PerNamespace uint64
	// PerPath caps the rule's traffic on a path index, on this node.
	PerPath map[uint32]uint64
	// Directions police caps; at least one for police.
	Directions Direction
	// HeadersMayBeRewritten is the admin's opt-in to header rewriting; the
	// window mode refuses to run without it.
	HeadersMayBeRewritten bool
	// BurstBytes is the bucket depth (police) or the largest window granted
	// at once (window). 0 chooses DefaultBurst.
	BurstBytes uint64
}

// DefaultBurst is the burst used when none is given: 200 ms at the largest
// cap, within [MinBurstBytes, MaxBurstBytes]. Measured on the test bed
// (docs/datapath.md, Rate): police needs it because each drop is a whole
// GSO segment and TCP's smallest window outruns the cap at sub-millisecond
// RTTs (100 KiB held 0.22 of a 40 Mbit/s cap, 1 MiB 0.93); window needs it
// because a window that ran out waits for the peer's delayed ACK (40 ms)
// and the grant accrued meanwhile must fit (20 ms held 0.38 of the cap).
func DefaultBurst(c RateConfig) uint64 {
	largest := max(c.PerConnection, c.PerPod, c.PerNamespace)
	for _, r := range c.PerPath {
		largest = max(largest, r)
	}
	return min(max(largest/8/5, uint64(MinBurstBytes)), uint64(MaxBurstBytes))
}

// Validate says what is wrong with c, if anything.
func (c RateConfig) Validate() error {
	switch c.Mode {
	case RateWindow, RatePolice, RateShape:
	default:
		return fmt.Errorf("unknown rate mode %d", uint32(c.Mode))
	}
	if c.PerConnection == 0 && c.PerPod == 0 && c.PerNamespace == 0 && len(c.PerPath) == 0 {
		return fmt.Errorf("%v: no cap set: want perConnection, perPod, perNamespace or perPath", c.Mode)
	}
	for p, r := range c.PerPath {
		if !ValidPath(p) {
			return fmt.Errorf("%v: path index %d out of range 1..%d", c.Mode, p, MaxPaths)
		}
		if r == 0 {
			return fmt.Errorf("%v: path %d: rate must be positive", c.Mode, p)
		}
	}
	if c.BurstBytes != 0 && c.BurstBytes < uint64(MinBurstBytes) {
		return fmt.Errorf("%v: burst %d bytes is below the %d-byte floor", c.Mode, c.BurstBytes, MinBurstBytes)
	}
	if c.BurstBytes > uint64(MaxBurstBytes) {
		return fmt.Errorf("%v: burst %d bytes is above the %d-byte ceiling", c.Mode, c.BurstBytes, MaxBurstBytes)
	}
	switch c.Mode {
	case RateWindow:
		if !c.HeadersMayBeRewritten {
			return errors.New("window: rewrites the TCP window, needs headers may be rewritten (admin opt-in)")
		}
		if c.PerConnection == 0 || c.PerPod != 0 || c.PerNamespace != 0 || len(c.PerPath) != 0 {
			return errors.New("window: caps connections only (perConnection); a window is per connection, not per pod or path")
		}
	case RatePolice:
		if c.Directions&(Egress|Ingress) == 0 || c.Directions&^(Egress|Ingress) != 0 {
			return fmt.Errorf("police: directions %#x: want egress, ingress or both", uint32(c.Directions))
		}
	case RateShape:
		if c.PerConnection != 0 {
			return errors.New("shape: HTB classes are per pod and per path; perConnection needs window or police")
		}
	}
	return nil
}

// RateBudget names the rules whose buckets and classes a rule's caps are
// charged to (rule ids): Pod for its pod caps (police buckets, the shape
// classes the datapath looks up, ShapeClass.Rule), Path for its police path
// caps. Rules that share a budget share those (the variants of one policy);
// a rule on its own has its own id for both. Connection caps are always the
// rule's own.
type RateBudget struct{ Pod, Path uint32 }

// OwnBudget is the budget of a rule that shares none.
func OwnBudget(id uint32) RateBudget { return RateBudget{Pod: id, Path: id} }

// SetRateRule writes rule id's rate caps, charged to budget b. Buckets and
// window edges of live connections keep their state; a new rate applies
// from the next packet.
func (d *Datapath) SetRateRule(id uint32, b RateBudget, c RateConfig) error {
	if err := c.Validate(); err != nil {
		return fmt.Errorf("rule %d: %w", id, err)
	}
	if n := d.objs.RateRules.MaxEntries(); b.Pod >= n || b.Path >= n {
		return fmt.Errorf("rule %d: budget %+v is not a rule id", id, b)
	}
	v := datapathRateCfg{Mode: uint32(c.Mode), ConnBps: c.PerConnection, PodBps: c.PerPod, BurstBytes: c.BurstBytes,
		Flags: rateBudget, Budget: b.Pod, PathBudget: b.Path, NsBps: c.PerNamespace}
	if c.PerNamespace != 0 {
		v.Flags |= rateNamespace
	}
	if v.BurstBytes == 0 {
		v.BurstBytes = DefaultBurst(c)
	}
	if c.Mode == RatePolice {
		v.Flags |= uint32(c.Directions)
		if coarseClockFits(c, v.BurstBytes) {
			v.Flags |= rateCoarseClock
		}
	}
	if c.HeadersMayBeRewritten {
		v.Flags |= rateHeadersMayBeRewritten
	}
	for p, r := range c.PerPath {
		v.PathBps[p] = r
	}
	v.ConnGcra = gcra(v.ConnBps, v.BurstBytes)
	v.PodGcra = gcra(v.PodBps, v.BurstBytes)
	for p := range v.PathBps {
		v.PathGcra[p] = gcra(v.PathBps[p], v.BurstBytes)
	}
	return d.objs.RateRules.Put(id, &v)
}

// gcra derives a police bucket's constants (struct rate_gcra) from its rate
// in bits per second and its depth in bytes, so that the datapath charges a
// packet with a multiplication and a shift instead of two divisions. A byte's
// cost in nanoseconds is kept as byteCost/2^shift with the finest shift (up
// to 32) that keeps byteCost below 2^32, so that times a packet's 32-bit
// length it fits 64 bits: about 9 significant digits at any rate. It is
// rounded up, so rounding never lets more through than the rate. Below
// 2 bit/s no shift fits and the constants stay zero: the datapath divides.
func gcra(bps, burst uint64) datapathRateGcra {
	if bps == 0 {
		return datapathRateGcra{}
	}
	tau := mulDiv(burst*8, uint64(time.Second), bps)
	for shift := uint32(32); ; shift-- {
		if cost := mulDivCeil(8*uint64(time.Second), 1<<shift, bps); cost < 1<<32 {
			return datapathRateGcra{ByteCost: cost, Shift: shift, TauNs: tau}
		}
		if shift == 0 {
			return datapathRateGcra{}
		}
	}
}

// mulDiv is a*b/c without overflowing 64 bits on the way, saturated at the
// largest uint64.
func mulDiv(a, b, c uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	if hi >= c {
		return math.MaxUint64
	}
	q, _ := bits.Div64(hi, lo, c)
	return q
}

// mulDivCeil is a*b/c rounded up, saturated as mulDiv.
func mulDivCeil(a, b, c uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	if hi >= c {
		return math.MaxUint64
	}
	q, r := bits.Div64(hi, lo, c)
	if r != 0 && q < math.MaxUint64 {
		q++
	}
	return q
}

// ClearRateRule removes rule id's rate caps; its traffic flows uncapped from
// the next packet.
func (d *Datapath) ClearRateRule(id uint32) error {
	if id >= d.objs.RateRules.MaxEntries() {
		return nil // never set: SetRateRule refuses such ids
	}
	return d.objs.RateRules.Put(id, &datapathRateCfg{Mode: uint32(datapathRateModeRATE_MODE_NONE)})
}

// RateRuleAt reads rule id's caps back as the datapath holds them; ok is
// false when the rule has none. BurstBytes is the burst in force (the
// default one when none was given).
func (d *Datapath) RateRuleAt(id uint32) (c RateConfig, ok bool, err error) {
	var v datapathRateCfg
	if err := d.objs.RateRules.Lookup(id, &v); err != nil {
		return c, false, fmt.Errorf("rule %d: reading its caps: %w", id, err)
	}
	if v.Mode == uint32(datapathRateModeRATE_MODE_NONE) {
		return c, false, nil
	}
	c = RateConfig{Mode: RateMode(v.Mode), PerConnection: v.ConnBps, PerPod: v.PodBps, PerNamespace: v.NsBps, BurstBytes: v.BurstBytes,
		Directions: Direction(v.Flags) & (Egress | Ingress), HeadersMayBeRewritten: v.Flags&rateHeadersMayBeRewritten != 0}
	for p, bps := range v.PathBps {
		if bps != 0 {
			if c.PerPath == nil {
				c.PerPath = map[uint32]uint64{}
			}
			c.PerPath[uint32(p)] = bps
		}
	}
	return c, true, nil
}

// RateRules lists the rules with rate caps.
func (d *Datapath) RateRules() ([]uint32, error) {
	var out []uint32
	var k uint32
	var v datapathRateCfg
	it := d.objs.RateRules.Iterate()
	for it.Next(&k, &v) {
		if v.Mode != uint32(datapathRateModeRATE_MODE_NONE) {
			out = append(out, k)
		}
	}
	return out, it.Err()
}

// PoliceDrops are the packets police dropped, by the bucket that refused
// them.
type PoliceDrops struct {
	Connection, Pod, Path uint64
}

// PoliceDrops reads the police drop counters, summed over CPUs.
func (d *Datapath) PoliceDrops() (PoliceDrops, error) {
	st, err := d.Stats()
	if err != nil {
		return PoliceDrops{}, err
	}
	return PoliceDrops{Connection: st[StatRateDropConn], Pod: st[StatRateDropPod], Path: st[StatRateDropPath]}, nil
}

// rateKindConn, rateKindPod and rateKindPath are enum rate_key_kind of
// rate.h, as struct rate_key's byte holds them.
const (
	rateKindConn = uint8(datapathRateKeyKindRATE_KEY_CONN)
	rateKindPod  = uint8(datapathRateKeyKindRATE_KEY_POD)
	rateKindPath = uint8(datapathRateKeyKindRATE_KEY_PATH)
)

func shapeKey(rule, path uint32, pod netip.Addr) datapathRateKey {
	k := datapathRateKey{Rule: rule, Id: path, Kind: rateKindPath}
	if pod.IsValid() {
		pod = pod.Unmap()
		k.Kind = rateKindPod
		k.Family = family(pod)
		copy(k.Addr[:], pod.AsSlice())
	}
	return k
}

// ShapeClass sends a rule's traffic leaving a path's NIC (or, with Pod
// valid, only that pod's) to the HTB class ClassID (TC_H_MAKE(major, minor)).
// Rule is the budget of the rules it is for (SetRateRule).
type ShapeClass struct {
	Rule, Path uint32
	Pod        netip.Addr
	ClassID    uint32
}

// ShapeClasses reads the classification table, as SyncShapeClasses wrote
// it, in no particular order.
func (d *Datapath) ShapeClasses() ([]ShapeClass, error) {
	var out []ShapeClass
	var k datapathRateKey
	var class uint32
	it := d.objs.RateClasses.Iterate()
	for it.Next(&k, &class) {
		c := ShapeClass{Rule: k.Rule, Path: k.Id, ClassID: class}
		if k.Kind == rateKindPod {
			if k.Family == family(netip.IPv4Unspecified()) {
				c.Pod = netip.AddrFrom4([4]byte(k.Addr[:4]))
			} else {
				c.Pod = netip.AddrFrom16(k.Addr)
			}
		}
		out = append(out, c)
	}
	return out, it.Err()
}

// SyncShapeClasses makes the classification table hold exactly want:
// entries are written first, then those not wanted are deleted, so a packet
// classified before the sync keeps a class throughout.
func (d *Datapath) SyncShapeClasses(want []ShapeClass) error {
	keep := map[datapathRateKey]bool{}
	for _, c := range want {
		k := shapeKey(c.Rule, c.Path, c.Pod)
		if err := d.objs.RateClasses.Put(&k, c.ClassID); err != nil {
			return fmt.Errorf("shape class %+v: %w", c, err)
		}
		keep[k] = true
	}
	return deleteUnwanted[datapathRateKey, uint32](d.objs.RateClasses, keep)
}

// PodNamespace puts a pod's address in its namespace's police bucket: ID
// names the bucket (every address of every pod of the namespace on this
// node with the same ID shares it), Bps and BurstBytes are its rate and
// depth (0: DefaultBurst at Bps), the same for all of them.
type PodNamespace struct {
	Pod        netip.Addr
	ID         uint32
	Bps        uint64
	BurstBytes uint64
}

// SyncPodNamespaces makes pod_namespaces hold exactly want: entries are
// written first, then those not wanted are deleted. A pod without an entry
// is charged to no namespace bucket, whatever its rules say.
func (d *Datapath) SyncPodNamespaces(want []PodNamespace) error {
	keep := map[datapathPodNsKey]bool{}
	for _, p := range want {
		if p.ID == 0 || p.Bps == 0 {
			return fmt.Errorf("namespace of %v: id %d, rate %d: want both positive", p.Pod, p.ID, p.Bps)
		}
		burst := p.BurstBytes
		if burst == 0 {
			burst = DefaultBurst(RateConfig{PerNamespace: p.Bps})
		}
		if burst < uint64(MinBurstBytes) || burst > uint64(MaxBurstBytes) {
			return fmt.Errorf("namespace of %v: burst %d bytes out of %d..%d", p.Pod, burst, MinBurstBytes, MaxBurstBytes)
		}
		ek := endpointKey(p.Pod)
		k := datapathPodNsKey{Addr: ek.Addr, Family: uint32(ek.Family)}
		v := datapathRateNs{Id: p.ID, Bps: p.Bps, BurstBytes: burst, Gcra: gcra(p.Bps, burst)}
		if err := d.objs.PodNamespaces.Put(&k, &v); err != nil {
			return fmt.Errorf("namespace of %v: %w", p.Pod, err)
		}
		keep[k] = true
	}
	return deleteUnwanted[datapathPodNsKey, datapathRateNs](d.objs.PodNamespaces, keep)
}
