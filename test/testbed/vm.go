package testbed

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/mptcp-operator/mptcp-operator/test/testbed/guest"
)

// Binding is how a guest is attached to its pod's network, as KubeVirt
// binds a VMI's interface to the virt-launcher pod's.
type Binding string

const (
	// BridgeBinding puts the pod's eth0 and the guest's tap in one
	// bridge and gives the guest the pod's address and MAC: the pod's
	// namespace keeps no address.
	BridgeBinding Binding = "bridge"
	// MasqueradeBinding gives the guest a private address behind a
	// bridge in the pod's namespace, which NATs it to the pod's address
	// both ways.
	MasqueradeBinding Binding = "masquerade"
)

// The masquerade binding's private network, KubeVirt's defaults.
var (
	masqueradeGateway = netip.MustParsePrefix("10.0.2.1/24")
	masqueradeGuest   = netip.MustParsePrefix("10.0.2.2/24")
)

// guestBridge and guestTap are the interfaces the bindings add to the
// pod's namespace, named as KubeVirt names them.
const (
	guestBridge = "k6t-eth0"
	guestTap    = "tap0"
)

// Guest is a VM booted in a pod's network namespace: the tenant's kernel,
// reached through guestd.
type Guest struct {
	*guest.VM
	Pod     *Pod
	Binding Binding
	Accel   guest.Accel
	// Addr is the guest's own address: the pod's with the bridge
	// binding, a private one with masquerade.
	Addr netip.Addr
	// Console is the path of the guest's console log.
	Console string
	// Booted is the time from QEMU's start to guestd's hello.
	Booted time.Duration
	proc   *Process

	mu         sync.Mutex
	awaitJoins int
}

// guestImages builds each guest image once per assets directory, output
// directory and process: every test's guests boot the same kernel and
// initramfs.
var guestImages = struct {
	sync.Mutex
	built map[[2]string]guest.Image
}{built: map[[2]string]guest.Image{}}

// GuestImage returns the guest image for assets, built into dir the first
// time it is asked for; dir must outlive the guests that boot it.
func GuestImage(assets, dir string) (guest.Image, error) {
	guestImages.Lock()
	defer guestImages.Unlock()
	key := [2]string{assets, dir}
	if img, ok := guestImages.built[key]; ok {
		return img, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return guest.Image{}, err
	}
	img, err := guest.BuildImage(assets, dir, nil)
	if err != nil {
		return img, err
	}
	guestImages.built[key] = img
	return img, nil
}

// BootGuest attaches a guest to pod with binding and boots it from img,
// with one vCPU and 256 MiB. Its eth0 is configured as the binding's DHCP
// would configure it; nothing else in it is (MPTCP is on, with the kernel's
// default limits). QEMU is one of the bed's processes: Down stops it.
func (b *Bed) BootGuest(ctx context.Context, pod *Pod, binding Binding, img guest.Image, accel guest.Accel) (*Guest, error) {
	g := &Guest{Pod: pod, Binding: binding, Accel: accel}
	mac, err := b.bindGuest(ctx, g)
	if err != nil {
		return nil, fmt.Errorf("binding a guest to %s (%s): %w", pod, binding, err)
	}
	dir := filepath.Join(b.Dir, fmt.Sprintf("vm%d", b.nextSeq()))
	m := guest.Machine{
		Image: img, Accel: accel, MemoryMiB: 256, CPUs: 1, Tap: guestTap, MAC: mac,
		Console: dir + ".console", Control: dir + ".ctl",
	}
	start := time.Now()
	args := m.QEMUArgs()
	if g.proc, err = b.Start(pod.NetNS, args...); err != nil {
		return nil, err
	}
	g.Console = m.Console
	bootCtx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if g.VM, err = guest.Connect(bootCtx, m.Control); err != nil {
		console, _ := tail(m.Console, 4<<10)
		return nil, fmt.Errorf("booting a guest in %s: %w; its console ends:\n%s", pod, err, console)
	}
	g.Booted = time.Since(start)
	cfg := guest.NetConfig{Interface: "eth0", Addr: netip.PrefixFrom(pod.Addr, 24), Gateway: podGateway(pod.Node.Index)}
	if binding == MasqueradeBinding {
		cfg = guest.NetConfig{Interface: "eth0", Addr: masqueradeGuest, Gateway: masqueradeGateway.Addr()}
	}
	g.Addr = cfg.Addr.Addr()
	if err := g.Configure(ctx, cfg); err != nil {
		g.Close()
		return nil, err
	}
	return g, nil
}

// bindGuest prepares the pod's namespace for the guest's tap and returns
// the MAC the guest takes.
func (b *Bed) bindGuest(ctx context.Context, g *Guest) (net.HardwareAddr, error) {
	pod := g.Pod
	mac := make(net.HardwareAddr, 6)
	if _, err := rand.Read(mac); err != nil {
		return nil, err
	}
	mac[0] = mac[0]&^1 | 2 // unicast, locally administered
	cmds := []string{
		fmt.Sprintf("tuntap add dev %s mode tap", guestTap),
		fmt.Sprintf("link add %s type bridge", guestBridge),
		fmt.Sprintf("link set %s master %s", guestTap, guestBridge),
	}
	switch g.Binding {
	case BridgeBinding:
		// The guest takes the pod's MAC, which the node's neighbour
		// entry already holds, and the pod's eth0 a new one.
		podMAC, err := b.linkMAC(pod.NetNS, "eth0")
		if err != nil {
			return nil, err
		}
		cmds = append(cmds,
			"addr flush dev eth0",
			fmt.Sprintf("link set eth0 address %s", mac),
			fmt.Sprintf("link set eth0 master %s", guestBridge),
		)
		mac = podMAC
	case MasqueradeBinding:
		cmds = append(cmds, fmt.Sprintf("addr add %s dev %s", masqueradeGateway, guestBridge))
	default:
		return nil, fmt.Errorf("unknown binding %q", g.Binding)
	}
	cmds = append(cmds, fmt.Sprintf("link set %s up", guestTap), fmt.Sprintf("link set %s up", guestBridge), "link set eth0 up")
	if err := ipBatch(ctx, pod.NetNS, cmds...); err != nil {
		return nil, err
	}
	if g.Binding != MasqueradeBinding {
		return mac, nil
	}
	if err := b.sysctl(ctx, pod.NetNS, "net.ipv4.ip_forward=1"); err != nil {
		return nil, err
	}
	for _, rule := range [][]string{
		{"-t", "nat", "-A", "PREROUTING", "-i", "eth0", "-j", "DNAT", "--to-destination", masqueradeGuest.Addr().String()},
		{"-t", "nat", "-A", "POSTROUTING", "-s", masqueradeGuest.Addr().String(), "-o", "eth0", "-j", "SNAT", "--to-source", pod.Addr.String()},
	} {
		if out, err := b.CommandContext(ctx, pod.NetNS, append([]string{"iptables"}, rule...)...).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("iptables %s: %w: %s", strings.Join(rule, " "), err, out)
		}
	}
	return mac, nil
}

func (b *Bed) linkMAC(ns, link string) (net.HardwareAddr, error) {
	out, err := b.Command(ns, "cat", "/sys/class/net/"+link+"/address").Output()
	if err != nil {
		return nil, fmt.Errorf("%s's MAC: %w", link, err)
	}
	return net.ParseMAC(strings.TrimSpace(string(out)))
}

// String names the guest by its pod and binding.
func (g *Guest) String() string { return fmt.Sprintf("guest of %s (%s)", g.Pod, g.Binding) }

// AwaitJoins makes the guest's MPTCP senders write nothing until their
// connection has n joins, as Bed.AwaitJoins does for a pod.
func (g *Guest) AwaitJoins(n int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.awaitJoins = n
}

// guestTraffic is where the image puts the traffic tool.
const guestTraffic = "/bin/traffic"

// Send runs the traffic tool's sender in the guest, as Bed.Send runs it
// in a pod.
func (g *Guest) Send(ctx context.Context, to netip.AddrPort, mptcp bool, args ...string) ([]SenderReport, error) {
	full := []string{guestTraffic, "send", "-to", to.String(), "-json"}
	if mptcp {
		full = append(full, "-mptcp")
		g.mu.Lock()
		if g.awaitJoins > 0 {
			full = append(full, "-await-joins", strconv.Itoa(g.awaitJoins))
		}
		g.mu.Unlock()
	}
	out, err := g.Run(ctx, append(full, args...)...)
	var reps []SenderReport
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		var r SenderReport
		if jerr := json.Unmarshal(sc.Bytes(), &r); jerr == nil {
			reps = append(reps, r)
		}
	}
	if g.Binding == MasqueradeBinding {
		// Peers see the pod's address (SNAT keeps the port): name each
		// connection as its server reports it.
		for i, r := range reps {
			if ap, perr := netip.ParseAddrPort(r.Local); perr == nil && ap.Addr() == g.Addr {
				reps[i].Local = netip.AddrPortFrom(g.Pod.Addr, ap.Port()).String()
			}
		}
	}
	if err != nil {
		return reps, fmt.Errorf("traffic send from %s: %w", g, err)
	}
	return reps, nil
}

// BootGuestForTest boots a guest for a test (BootGuest), with the image
// built into dir once per process and the accelerator guest.AccelEnv
// names. Without QEMU or the guest assets the test is skipped with the
// reason, or fails under CI. The end of the guest's console is logged when
// the test fails (the bed's directory, which holds the console, goes with
// the bed).
func (b *Bed) BootGuestForTest(t testing.TB, pod *Pod, binding Binding, dir string) *Guest {
	t.Helper()
	RequireTools(t, "qemu-system-x86_64")
	assets, err := guest.Assets()
	if err != nil {
		Unavailable(t, "%v", err)
	}
	accel, err := guest.AccelFromEnv()
	if err != nil {
		t.Fatal(err)
	}
	img, err := GuestImage(assets, dir)
	if err != nil {
		t.Fatal(err)
	}
	return b.BootImageForTest(t, pod, binding, img, accel)
}

// BootImageForTest is BootGuestForTest with an image of the test's own.
func (b *Bed) BootImageForTest(t testing.TB, pod *Pod, binding Binding, img guest.Image, accel guest.Accel) *Guest {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	g, err := b.BootGuest(ctx, pod, binding, img, accel)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		g.Close()
		if t.Failed() {
			if console, err := tail(g.Console, 64<<10); err == nil {
				t.Logf("%s's console:\n%s", g, lastLines(string(console), 30))
			}
		}
	})
	t.Logf("%s: kernel %s, %s, booted in %v", g, g.Hello.Kernel, accel, g.Booted.Round(10*time.Millisecond))
	return g
}

// tail reads at most the last n bytes of a file (a guest may fill its
// console without end).
func tail(path string, n int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.Size() > n {
		if _, err := f.Seek(-n, io.SeekEnd); err != nil {
			return nil, err
		}
	}
	return io.ReadAll(io.LimitReader(f, n))
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// GuestTrafficServer is the traffic tool's server in a guest.
type GuestTrafficServer struct {
	Guest *Guest
	// Addr is where the guest listens: its own address.
	Addr   netip.AddrPort
	proc   *guest.Process
	report string
}

// StartTrafficServer starts the traffic tool's server in the guest, as
// Bed.StartTrafficServer does in a pod, and returns once it listens.
func (g *Guest) StartTrafficServer(ctx context.Context, port int, mptcp bool, extra ...string) (*GuestTrafficServer, error) {
	s := &GuestTrafficServer{Guest: g, Addr: netip.AddrPortFrom(g.Addr, uint16(port)), report: fmt.Sprintf("/tmp/serve-%d.jsonl", port)}
	args := []string{guestTraffic, "serve", "-listen", s.Addr.String(), "-report", s.report, "-drain", serverDrain.String()}
	if mptcp {
		args = append(args, "-mptcp")
	}
	var err error
	if s.proc, err = g.Start(ctx, append(args, extra...)...); err != nil {
		return nil, err
	}
	if err := g.WaitListening(ctx, port); err != nil {
		return nil, err
	}
	return s, nil
}

// WaitListening waits (10 s at most) until a TCP socket of the guest
// listens on port. A process started in the guest says nothing until it
// exits, but its listener shows in /proc/net/tcp (an MPTCP listener's
// too, through its first subflow's socket).
func (g *Guest) WaitListening(ctx context.Context, port int) error {
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	want := fmt.Sprintf(":%04X 00000000:0000 0A", port)
	for {
		tcp, err := g.ReadFile(wctx, "/proc/net/tcp")
		if err != nil {
			return fmt.Errorf("%s: waiting for a listener on port %d: %w", g, port, err)
		}
		if strings.Contains(tcp, want) {
			return nil
		}
		select {
		case <-wctx.Done():
			return fmt.Errorf("%s: nothing listens on port %d", g, port)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Stop stops the server (SIGTERM): connections still open are reported as
// stopped.
func (s *GuestTrafficServer) Stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), serverDrain+5*time.Second)
	defer cancel()
	if err := s.proc.Signal(ctx, syscall.SIGTERM); err != nil {
		return err
	}
	resp, err := s.proc.Wait(ctx)
	if err != nil {
		return err
	}
	if resp.Exit != 0 {
		return fmt.Errorf("%s: the traffic server exited %d: %s", s.Guest, resp.Exit, strings.TrimSpace(resp.Stderr))
	}
	return nil
}

// Reports returns the connections the server has finished so far.
func (s *GuestTrafficServer) Reports() ([]ServerReport, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	data, err := s.Guest.ReadFile(ctx, s.report)
	if err != nil && !strings.Contains(err.Error(), "no such file") {
		return nil, err
	}
	return parseServerReports([]byte(data))
}
