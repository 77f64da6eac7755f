package datapath

import (
	"errors"
	"fmt"
	"log/slog"
	"math/bits"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/mptcp-operator/mptcp-operator/internal/limits"
)

// MaxPaths is how many paths one node can steer over. A path's index,
// 1..MaxPaths, is the value of its mark (0 means "not steered"), so the mark
// needs four bits; the API assigns the same numbers (MPTCPPath status.index).
const MaxPaths = limits.Paths

// ValidPath says whether index numbers a path.
func ValidPath(index uint32) bool { return index >= 1 && index <= uint32(MaxPaths) }

// DefaultMarkMask is the part of skb->mark the datapath owns unless told
// otherwise. It avoids the bits kube-proxy (0x4000, 0x8000) and Cilium (0x0f00
// and the upper half word for identities is only used with its own routing)
// use by default; Calico's default 0xffff0000 overlaps it, so set
// markMask when running next to Calico (docs/datapath.md).
const DefaultMarkMask uint32 = 0x00f00000

// Options configure a load. Zero values mean the defaults.
type Options struct {
	// PinDir is a directory on bpffs where maps and links are pinned, so a
	// restarted agent finds the same state and live subflows keep their path.
	PinDir string
	// MarkMask is the contiguous run of skb->mark bits that carries the path.
	MarkMask uint32
	// Migrate converts pinned maps whose layout differs from this binary's
	// and switches the pinned links to the new programs (migrate.go); the
	// caller then settles it with CommitMigration or RollbackMigration.
	// Without it (tools and tests reading a running agent's maps) pinned
	// maps are reused as they are.
	Migrate bool
	// Log receives what a migration does; nil discards it.
	Log *slog.Logger
}

// Datapath is the loaded set of programs and maps of one node.
type Datapath struct {
	objs      datapathObjects
	pinDir    string
	markMask  uint32
	markShift uint32
	// mapNames are the maps pinned under pinDir, for Unpin.
	mapNames  []string
	migration *migration
	// podMapSpecs are the inner maps of the per-pod maps, by their outer
	// map's name (arrivals.go).
	podMapSpecs map[string]*ebpf.MapSpec
}

// Load loads the BPF objects, reusing maps pinned under opts.PinDir.
func Load(opts Options) (*Datapath, error) {
	mask := opts.MarkMask
	if mask == 0 {
		mask = DefaultMarkMask
	}
	shift, err := markShift(mask)
	if err != nil {
		return nil, err
	}
	spec, seed, err := datapathSpec(opts.PinDir, mask, shift)
	if err != nil {
		return nil, err
	}
	copts, err := collectionOptions(spec, opts.PinDir)
	if err != nil {
		return nil, err
	}
	dp := &Datapath{pinDir: opts.PinDir, markMask: mask, markShift: shift, mapNames: pinnedMapNames(spec),
		podMapSpecs: map[string]*ebpf.MapSpec{}}
	release, cpus := kernelRelease(), ebpf.MustPossibleCPU()
	for _, name := range perPodMaps {
		inner := spec.Maps[name].InnerMap.Copy()
		inner.MaxEntries = podMapEntries(inner.MaxEntries, release, cpus)
		dp.podMapSpecs[name] = inner
	}
	if opts.PinDir != "" && opts.Migrate {
		log := opts.Log
		if log == nil {
			log = slog.New(slog.DiscardHandler)
		}
		if dp.migration, err = prepareMigration(spec, opts.PinDir, log); err != nil {
			return nil, err
		}
		copts.MapReplacements = dp.migration.replacements()
	}
	if err := spec.LoadAndAssign(&dp.objs, &copts); err != nil {
		if dp.migration != nil {
			dp.migration.closeMaps()
		}
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return nil, fmt.Errorf("loading BPF objects: %+w: %w", ve, err)
		}
		return nil, fmt.Errorf("loading BPF objects: %w", err)
	}
	if err := dp.start(&seed); err != nil {
		_ = dp.objs.Close()
		return nil, err
	}
	return dp, nil
}

// datapathSpec is the datapath's collection with the node's table seed
// (kept with the pins, or new) and mark mask set.
func datapathSpec(pinDir string, mask, shift uint32) (*ebpf.CollectionSpec, datapathTableSeedValue, error) {
	spec, err := loadDatapath()
	if err != nil {
		return nil, datapathTableSeedValue{}, fmt.Errorf("reading BPF objects: %w", err)
	}
	seed, err := tableSeed(pinDir)
	if err != nil {
		return nil, seed, err
	}
	for name, v := range map[string]any{"table_seed": seed.Seed, "mark_mask": mask, "mark_shift": shift} {
		if err := spec.Variables[name].Set(v); err != nil {
			return nil, seed, fmt.Errorf("setting %s: %w", name, err)
		}
	}
	return spec, seed, nil
}

// collectionOptions pins the maps under pinDir, or, without one (tests,
// benchmarks), makes every map private.
func collectionOptions(spec *ebpf.CollectionSpec, pinDir string) (ebpf.CollectionOptions, error) {
	var copts ebpf.CollectionOptions
	if pinDir == "" {
		for _, m := range spec.Maps {
			m.Pinning = ebpf.PinNone
		}
		return copts, nil
	}
	if err := os.MkdirAll(pinDir, 0o700); err != nil {
		return copts, fmt.Errorf("creating pin directory: %w", err)
	}
	copts.Maps.PinPath = pinDir
	return copts, nil
}

// start readies the datapath just loaded: the table seed kept, the pods'
// maps restored, a migration started, the pods' subflows counted.
func (d *Datapath) start(seed *datapathTableSeedValue) error {
	if err := d.objs.TableSeeds.Put(uint32(0), seed); err != nil {
		return fmt.Errorf("keeping the table seed: %w", err)
	}
	// Before a migration switches the links: the new programs stage
	// every selected pod's SYNs and answered joins from their first packet.
	if err := d.restorePodMaps(); err != nil {
		return err
	}
	if err := d.startMigration(); err != nil {
		return err
	}
	return d.RecountPodSubflows()
}

// startMigration switches the pinned links to the programs just loaded and
// catches up, when maps were migrated; otherwise it records the layout.
func (d *Datapath) startMigration() error {
	if d.migration == nil {
		return nil
	}
	if !d.MigrationPending() {
		hash := d.migration.hash
		d.migration = nil
		return writeLayoutMarker(d.pinDir, hash)
	}
	if err := d.fillTables(); err != nil {
		return errors.Join(err, d.RollbackMigration())
	}
	if err := d.switchLinks(); err != nil {
		return errors.Join(err, d.RollbackMigration())
	}
	if err := d.catchUp(); err != nil {
		return errors.Join(err, d.RollbackMigration())
	}
	return nil
}

// markShift checks that mask is one contiguous run of at least four bits and
// returns the position of its lowest bit.
func markShift(mask uint32) (uint32, error) {
	shift := uint32(bits.TrailingZeros32(mask))
	run := mask >> shift
	if run&(run+1) != 0 {
		return 0, fmt.Errorf("mark mask %#x is not one contiguous run of bits", mask)
	}
	if bits.OnesCount32(mask) < 4 {
		return 0, fmt.Errorf("mark mask %#x has fewer than 4 bits: %d paths need 4", mask, MaxPaths)
	}
	return shift, nil
}

// Mark returns the mark value (within MarkMask) that the datapath gives
// packets placed on path: its index, shifted into the mask.
func (d *Datapath) Mark(path uint32) uint32 {
	return (path << d.markShift) & d.markMask
}

// MarkMask returns the mark bits the datapath owns.
func (d *Datapath) MarkMask() uint32 { return d.markMask }

// Close releases the file descriptors. Pinned maps and links stay, so the
// datapath keeps working without the agent.
func (d *Datapath) Close() error {
	return d.objs.Close()
}

// Unpin removes every pinned object of this datapath; with Close and the
// links detached, nothing of it remains in the kernel.
func (d *Datapath) Unpin() error {
	if d.pinDir == "" {
		return nil
	}
	// By path, not with Map.Unpin: a migrated map was renamed onto its pin,
	// which the Map does not know.
	for _, n := range append(slices.Clone(d.mapNames), layoutMarkerPin) {
		if err := os.Remove(filepath.Join(d.pinDir, n)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	if err := os.RemoveAll(filepath.Join(d.pinDir, stagingSubdir)); err != nil {
		return err
	}
	return os.RemoveAll(filepath.Join(d.pinDir, linkPinSubdir))
}

// settingObserveOnly is SETTING_OBSERVE_ONLY of enum setting_flag.
const settingObserveOnly = uint32(datapathSettingFlagSETTING_OBSERVE_ONLY)

// SetObserveOnly switches observe-only mode on or off at run time, without a
// reload or a re-attach: the programs read the switch on every packet they
// would mark. On, they keep recording what they record (subflows with the
// path they would choose, connections, counters) but never write skb->mark,
// and count StatObserved where they would count StatMarked. The switch lives
// in a pinned map, so it survives the agent like the rest of the state.
func (d *Datapath) SetObserveOnly(on bool) error {
	var v datapathSettingsValue
	// Keep the other switches of the entry as they are.
	if err := d.objs.Settings.Lookup(uint32(0), &v); err != nil {
		return fmt.Errorf("reading settings: %w", err)
	}
	if on {
		v.Flags |= settingObserveOnly
	} else {
		v.Flags &^= settingObserveOnly
	}
	if err := d.objs.Settings.Put(uint32(0), &v); err != nil {
		return fmt.Errorf("writing settings: %w", err)
	}
	return nil
}

// SetLivenessPort tells nic_ingress the UDP port of the agents' liveness
// probes (0: none): it marks those arriving on a path NIC with the NIC's
// path, so that strict reverse-path filtering accepts them there.
func (d *Datapath) SetLivenessPort(port uint16) error {
	var v datapathSettingsValue
	if err := d.objs.Settings.Lookup(uint32(0), &v); err != nil {
		return fmt.Errorf("reading settings: %w", err)
	}
	v.LivenessPort = port
	if err := d.objs.Settings.Put(uint32(0), &v); err != nil {
		return fmt.Errorf("writing settings: %w", err)
	}
	return nil
}

// SetTunnel tells nic_ingress the UDP port of the overlay's tunnel and the
// node's own address on it (port 0 or an invalid local: none): it marks
// the outer packets arriving to that port and address on a path NIC with
// the NIC's path, which decapsulation leaves on the inner packet. Outer
// packets to another address, which the node would forward, keep none.
func (d *Datapath) SetTunnel(port uint16, local netip.Addr) error {
	var v datapathSettingsValue
	if err := d.objs.Settings.Lookup(uint32(0), &v); err != nil {
		return fmt.Errorf("reading settings: %w", err)
	}
	v.TunnelPort, v.TunnelFamily, v.TunnelLocal = port, 0, [16]uint8{}
	switch {
	case port == 0 || !local.IsValid():
	case local.Is4() || local.Is4In6():
		a := local.Unmap().As4()
		copy(v.TunnelLocal[:], a[:])
		v.TunnelFamily = unix.AF_INET
	default:
		v.TunnelLocal, v.TunnelFamily = local.As16(), unix.AF_INET6
	}
	if err := d.objs.Settings.Put(uint32(0), &v); err != nil {
		return fmt.Errorf("writing settings: %w", err)
	}
	return nil
}

// SetShapeDevice tells nic_egress the node's shaping device (an ifb holding
// the pods' and namespaces' HTB classes, 0: none): on it, nic_egress gives
// each packet its pod's class; on a path NIC, a packet that device gave back
// takes its rule's path class only (docs/datapath.md, "shape scope").
func (d *Datapath) SetShapeDevice(ifindex int) error {
	var v datapathSettingsValue
	if err := d.objs.Settings.Lookup(uint32(0), &v); err != nil {
		return fmt.Errorf("reading settings: %w", err)
	}
	v.ShapeIfindex = uint32(ifindex)
	if err := d.objs.Settings.Put(uint32(0), &v); err != nil {
		return fmt.Errorf("writing settings: %w", err)
	}
	return nil
}

// ObserveOnly says whether the datapath is in observe-only mode.
func (d *Datapath) ObserveOnly() (bool, error) {
	var v datapathSettingsValue
	if err := d.objs.Settings.Lookup(uint32(0), &v); err != nil {
		return false, fmt.Errorf("reading settings: %w", err)
	}
	return v.Flags&settingObserveOnly != 0, nil
}

func addrFrom(fam uint8, b [16]uint8) netip.Addr {
	if fam == 2 {
		return netip.AddrFrom4([4]byte(b[:4]))
	}
	return netip.AddrFrom16(b)
}

// SetNIC declares the interface with ifindex as path's NIC on this node.
func (d *Datapath) SetNIC(ifindex int, path uint32) error {
	if !ValidPath(path) {
		return fmt.Errorf("path index %d out of range 1..%d", path, MaxPaths)
	}
	return d.objs.Nics.Put(uint32(ifindex), &datapathNic{Path: path})
}

// SetPathNIC names path's NIC on this node (ifindex; 0: none) and the next
// hop beyond it (invalid: the NIC's link, each packet's own destination):
// nic_egress sends there a subflow's packet of path that a CNI sent out of
// another NIC.
func (d *Datapath) SetPathNIC(path uint32, ifindex int, nextHop netip.Addr) error {
	if !ValidPath(path) {
		return fmt.Errorf("path index %d out of range 1..%d", path, MaxPaths)
	}
	v := datapathPathNic{Ifindex: uint32(ifindex)}
	if nextHop.IsValid() {
		v.NhFamily = unix.AF_INET6
		if nextHop.Unmap().Is4() {
			v.NhFamily = unix.AF_INET
			nextHop = nextHop.Unmap()
		}
		copy(v.Nh[:], nextHop.AsSlice())
	}
	return d.objs.PathNics.Put(path, &v)
}

// nicTunnel is NIC_TUNNEL of enum nic_flag.
const nicTunnel = uint32(datapathNicFlagNIC_TUNNEL)

// SetTunnelNIC declares the interface with ifindex as an overlay's tunnel
// device: what it decapsulates is on the path its outer packet's mark names
// (SetTunnelPort), and nic_ingress on it judges that as on a path's NIC.
func (d *Datapath) SetTunnelNIC(ifindex int) error {
	return d.objs.Nics.Put(uint32(ifindex), &datapathNic{Flags: nicTunnel})
}

// DeleteNIC forgets the interface with ifindex.
func (d *Datapath) DeleteNIC(ifindex int) error {
	if err := d.objs.Nics.Delete(uint32(ifindex)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return err
	}
	return nil
}

// Program returns the loaded program that runs at hook h, for running it on
// crafted packets (BPF_PROG_TEST_RUN) in tests and benchmarks. The agent
// attaches programs with Attach instead.
func (d *Datapath) Program(h Hook) *ebpf.Program {
	p, _ := d.hookProgram(h)
	return p
}

// ForgetSubflow removes the subflow with this 4-tuple, as the local pod
// sends it, from the subflow table: its next packets are no longer marked,
// and an opening SYN with the same 4-tuple is placed anew.
func (d *Datapath) ForgetSubflow(local, remote netip.AddrPort) error {
	if local.Addr().Unmap().Is4() != remote.Addr().Unmap().Is4() {
		return fmt.Errorf("subflow %v -> %v mixes address families", local, remote)
	}
	n, err := d.deleteTable(tableSubflows, flowKey(local, remote))
	if err != nil || n == 0 {
		return err
	}
	return d.countForgotten(StatSubflowForgotten, uint64(n))
}

// ClosedSubflow is a report that the local pod's kernel closed a subflow:
// its 4-tuple as the pod sends it, when the report was heard, and what
// names the subflow beyond its 4-tuple, so that a report that comes late
// never closes a newer subflow of the same 4-tuple. Zero Token and
// CreatedNs match any subflow of the 4-tuple placed before Heard.
type ClosedSubflow struct {
	Local, Remote netip.AddrPort
	Heard         time.Time
	// Token is the connection as the pod's kernel named it in its event:
	// either side's token.
	Token uint32
	// CreatedNs is the entry's placement time as a sweep read it
	// (Subflow.CreatedNs).
	CreatedNs uint64
}

// SubflowClosed tells the datapath that the local pod's kernel closed a
// subflow: if the entry of its 4-tuple is the one c names, its connection
// gets back what the subflow took from it, once (its path when it held it
// alone, its place in the count), so that a join opened to replace it is
// placed on that path again and stays within the rule's maximum; then the
// entry goes, and a SYN for the 4-tuple that the pod answered meanwhile
// takes it. closed is false when no entry went; path is the one the entry
// had (its own, whether or not it travelled a detour), for a replacement
// to wait for while it is down.
func (d *Datapath) SubflowClosed(c ClosedSubflow) (path uint32, closed bool, err error) {
	if c.Local.Addr().Unmap().Is4() != c.Remote.Addr().Unmap().Is4() {
		return 0, false, fmt.Errorf("subflow %v -> %v mixes address families", c.Local, c.Remote)
	}
	report := datapathClosedReport{HeardNs: ktimeOf(c.Heard), CreatedNs: c.CreatedNs, Token: c.Token}
	out, err := d.tableRequest(tableSubflows, datapathTableOpCodeTABLE_OP_SUBFLOW_CLOSED, rawBytes(flowKey(c.Local, c.Remote)), rawBytes(report))
	if err != nil || out.Result == 0 {
		return 0, false, err
	}
	return out.ClosedPath, true, nil
}

// ForgetConnection removes the connection of the local pod known by any of
// tokens (either side's), so that its next MP_CAPABLE ACK is learnt again.
func (d *Datapath) ForgetConnection(local netip.Addr, tokens ...uint32) error {
	local = local.Unmap()
	for _, tok := range tokens {
		k := datapathConnKey{Family: family(local), Token: tok}
		copy(k.Local[:], local.AsSlice())
		var alias datapathConnAlias
		if err := d.objs.ConnAliases.Lookup(&k, &alias); err == nil {
			ck := k
			ck.Token = alias.Canonical
			if err := d.objs.ConnStates.Delete(&ck); err == nil {
				if err := d.countForgotten(StatConnForgotten, 1); err != nil {
					return err
				}
			} else if !errors.Is(err, ebpf.ErrKeyNotExist) {
				return err
			}
		}
		if err := d.objs.ConnAliases.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return err
		}
	}
	return nil
}

// htons stores a port in network byte order.
func htons(p uint16) uint16 { return p>>8 | p<<8 }
