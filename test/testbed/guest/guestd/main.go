// guestd is the init of a test bed guest: it mounts what a guest needs,
// loads the network driver's modules, and then does what the host asks on
// the guest's second serial port (github.com/mptcp-operator/mptcp-operator/test/testbed/guest):
// configure the network and the in-kernel MPTCP path manager as a tenant
// would, and run the bed's tools. It is built static and runs only as PID 1.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/mptcp-operator/mptcp-operator/internal/mptcpnl"
	"github.com/mptcp-operator/mptcp-operator/test/testbed/guest"
)

// controlPort is the serial port the host's control socket is wired to
// (QEMU's second -serial).
const controlPort = "/dev/ttyS1"

// moduleOrder lists the modules to load, one file name of /lib/modules
// per line, each after those it needs.
const moduleOrder = "/lib/modules/order"

// maxOutput bounds what a command's stdout or stderr returns.
const maxOutput = 1 << 20

func main() {
	log.SetFlags(0)
	log.SetPrefix("guestd: ")
	if os.Getpid() != 1 {
		log.Fatal("guestd is a guest's init (PID 1)")
	}
	if err := setUp(); err != nil {
		log.Printf("setting up: %v", err)
		halt()
	}
	port, err := os.OpenFile(controlPort, os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		log.Printf("control port: %v", err)
		halt()
	}
	if err := makeRaw(port); err != nil {
		log.Printf("control port: %v", err)
		halt()
	}
	s := &server{out: port, procs: map[uint64]*proc{}}
	if err := s.hello(); err != nil {
		log.Printf("hello: %v", err)
		halt()
	}
	s.serve(port)
	halt()
}

// halt powers the guest off; QEMU runs with -no-reboot and exits.
func halt() {
	unix.Sync()
	_ = unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
	select {}
}

func setUp() error {
	for _, m := range []struct{ src, dst, fstype string }{
		{"proc", "/proc", "proc"}, {"sysfs", "/sys", "sysfs"}, {"devtmpfs", "/dev", "devtmpfs"}, {"tmpfs", "/tmp", "tmpfs"},
	} {
		if err := os.MkdirAll(m.dst, 0o755); err != nil {
			return err
		}
		if err := unix.Mount(m.src, m.dst, m.fstype, 0, ""); err != nil && !errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("mounting %s: %w", m.dst, err)
		}
	}
	order, err := os.ReadFile(moduleOrder)
	if err != nil {
		return err
	}
	for _, name := range strings.Fields(string(order)) {
		if err := loadModule(filepath.Join(filepath.Dir(moduleOrder), name)); err != nil {
			return err
		}
	}
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return err
	}
	return netlink.LinkSetUp(lo)
}

func loadModule(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.FinitModule(int(f.Fd()), "", 0); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("loading %s: %w", path, err)
	}
	return nil
}

// makeRaw turns off the serial line's echo and line editing, so that the
// port carries the host's bytes unchanged.
func makeRaw(f *os.File) error {
	t, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	if err != nil {
		return err
	}
	t.Iflag &^= unix.IGNBRK | unix.BRKINT | unix.PARMRK | unix.ISTRIP | unix.INLCR | unix.IGNCR | unix.ICRNL | unix.IXON
	t.Oflag &^= unix.OPOST
	t.Lflag &^= unix.ECHO | unix.ECHONL | unix.ICANON | unix.ISIG | unix.IEXTEN
	t.Cflag &^= unix.CSIZE | unix.PARENB
	t.Cflag |= unix.CS8
	t.Cc[unix.VMIN], t.Cc[unix.VTIME] = 1, 0
	return unix.IoctlSetTermios(int(f.Fd()), unix.TCSETS, t)
}

type server struct {
	mu    sync.Mutex // serialises writes to out and guards procs
	out   io.Writer
	procs map[uint64]*proc
}

// proc is a command started by a start request.
type proc struct {
	cmd            *exec.Cmd
	stdout, stderr bytes.Buffer
	done           chan struct{}
	exit           int
}

func (s *server) write(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	_, err = s.out.Write(append(b, '\n'))
	return err
}

func (s *server) hello() error {
	var u unix.Utsname
	_ = unix.Uname(&u)
	up, _ := os.ReadFile("/proc/uptime")
	secs, _ := strconv.ParseFloat(strings.Fields(string(up) + " 0")[0], 64)
	return s.write(guest.Hello{Kernel: unix.ByteSliceToString(u.Release[:]), UptimeMillis: int64(secs * 1000)})
}

func (s *server) serve(r io.Reader) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var req guest.Request
		if err := json.Unmarshal(sc.Bytes(), &req); err != nil {
			log.Printf("request %q: %v", sc.Text(), err)
			continue
		}
		go func() {
			resp := s.handle(req)
			resp.ID = req.ID
			if err := s.write(resp); err != nil {
				log.Printf("answering %d: %v", req.ID, err)
			}
		}()
	}
	log.Printf("control port closed: %v", sc.Err())
}

func (s *server) handle(req guest.Request) guest.Response {
	fail := func(err error) guest.Response { return guest.Response{Error: err.Error()} }
	switch req.Op {
	case guest.OpExec:
		p, err := s.start(req.ID, req.Args, false)
		if err != nil {
			return fail(err)
		}
		return p.wait()
	case guest.OpStart:
		if _, err := s.start(req.ID, req.Args, true); err != nil {
			return fail(err)
		}
		return guest.Response{}
	case guest.OpWait, guest.OpSignal:
		s.mu.Lock()
		p := s.procs[req.Proc]
		s.mu.Unlock()
		if p == nil {
			return fail(fmt.Errorf("no process %d", req.Proc))
		}
		if req.Op == guest.OpSignal {
			if err := p.cmd.Process.Signal(syscall.Signal(req.Signal)); err != nil {
				return fail(err)
			}
			return guest.Response{}
		}
		resp := p.wait()
		s.mu.Lock()
		delete(s.procs, req.Proc)
		s.mu.Unlock()
		return resp
	case guest.OpNet:
		if req.Net == nil {
			return fail(errors.New("net: no configuration"))
		}
		if err := configureNet(*req.Net); err != nil {
			return fail(err)
		}
		return guest.Response{}
	case guest.OpMPTCP:
		if req.MPTCP == nil {
			return fail(errors.New("mptcp: no configuration"))
		}
		if err := configureMPTCP(*req.MPTCP); err != nil {
			return fail(err)
		}
		return guest.Response{}
	case guest.OpRead:
		b, err := os.ReadFile(req.Path)
		if err != nil {
			return fail(err)
		}
		return guest.Response{Stdout: string(b)}
	case guest.OpSubflows:
		sfs, err := mptcpnl.ListSubflows(0)
		if err != nil {
			return fail(err)
		}
		b, err := json.Marshal(sfs)
		if err != nil {
			return fail(err)
		}
		return guest.Response{Stdout: string(b)}
	case guest.OpWrite:
		if err := os.WriteFile(req.Path, []byte(req.Data), 0o644); err != nil {
			return fail(err)
		}
		return guest.Response{}
	}
	return fail(fmt.Errorf("unknown op %q", req.Op))
}

func (s *server) start(id uint64, args []string, keep bool) (*proc, error) {
	if len(args) == 0 {
		return nil, errors.New("no command")
	}
	p := &proc{cmd: exec.Command(args[0], args[1:]...), done: make(chan struct{})}
	p.cmd.Stdout, p.cmd.Stderr = &capped{b: &p.stdout}, &capped{b: &p.stderr}
	if err := p.cmd.Start(); err != nil {
		return nil, err
	}
	if keep {
		s.mu.Lock()
		s.procs[id] = p
		s.mu.Unlock()
	}
	go func() {
		err := p.cmd.Wait()
		var ee *exec.ExitError
		switch {
		case errors.As(err, &ee):
			p.exit = ee.ExitCode()
		case err != nil:
			p.exit = -1
		}
		close(p.done)
	}()
	return p, nil
}

func (p *proc) wait() guest.Response {
	<-p.done
	return guest.Response{Exit: p.exit, Stdout: p.stdout.String(), Stderr: p.stderr.String()}
}

// capped keeps the first maxOutput bytes written to it.
type capped struct{ b *bytes.Buffer }

func (c *capped) Write(p []byte) (int, error) {
	if room := maxOutput - c.b.Len(); room > 0 {
		c.b.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func configureNet(c guest.NetConfig) error {
	link, err := netlink.LinkByName(c.Interface)
	if err != nil {
		return err
	}
	if c.MTU > 0 {
		if err := netlink.LinkSetMTU(link, c.MTU); err != nil {
			return err
		}
	}
	addr, err := netlink.ParseAddr(c.Addr.String())
	if err != nil {
		return err
	}
	if err := netlink.AddrReplace(link, addr); err != nil {
		return err
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return err
	}
	if !c.Gateway.IsValid() {
		return nil
	}
	return netlink.RouteReplace(&netlink.Route{LinkIndex: link.Attrs().Index, Gw: c.Gateway.AsSlice()})
}

var endpointFlags = map[string]uint32{
	"signal": mptcpnl.FlagSignal, "subflow": mptcpnl.FlagSubflow, "backup": mptcpnl.FlagBackup, "fullmesh": mptcpnl.FlagFullmesh,
}

func configureMPTCP(c guest.MPTCPConfig) error {
	conn, err := mptcpnl.Dial(0)
	if err != nil {
		return err
	}
	defer conn.Close()
	if err := conn.SetLimits(mptcpnl.Limits{Subflows: c.Subflows, AddAddrAccepted: c.AddAddrAccepted}); err != nil {
		return fmt.Errorf("limits: %w", err)
	}
	if err := conn.FlushEndpoints(); err != nil {
		return fmt.Errorf("flushing endpoints: %w", err)
	}
	for i, e := range c.Endpoints {
		ep := mptcpnl.Endpoint{Addr: e.Addr, ID: uint8(i + 1), Port: e.Port}
		for _, f := range e.Flags {
			bit, ok := endpointFlags[f]
			if !ok {
				return fmt.Errorf("endpoint %v: unknown flag %q", e.Addr, f)
			}
			ep.Flags |= bit
		}
		if e.Interface != "" {
			link, err := netlink.LinkByName(e.Interface)
			if err != nil {
				return err
			}
			ep.IfIndex = int32(link.Attrs().Index)
		}
		if err := conn.AddEndpoint(ep); err != nil {
			return fmt.Errorf("endpoint %v: %w", e.Addr, err)
		}
	}
	return nil
}
