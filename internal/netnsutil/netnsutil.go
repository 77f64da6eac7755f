// Package netnsutil runs code inside another network namespace. Go moves
// goroutines between OS threads, and setns(2) changes only the calling
// thread, so the work runs on a locked thread that is switched and switched
// back; a thread that cannot be switched back is never reused.
package netnsutil

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"

	"github.com/vishvananda/netns"
)

// Do runs fn with the calling thread in the network namespace at path (a
// bind-mounted namespace such as /var/run/netns/NAME or /proc/PID/ns/net).
func Do(path string, fn func() error) error {
	target, err := netns.GetFromPath(path)
	if err != nil {
		return fmt.Errorf("opening network namespace %s: %w", path, err)
	}
	defer target.Close()
	return do(target, path, fn)
}

// DoFD runs fn with the calling thread in the network namespace of the
// file descriptor fd (from Open), which stays open: the namespace the
// caller checked, whatever its path names by now.
func DoFD(fd int, fn func() error) error {
	return do(netns.NsHandle(fd), fmt.Sprintf("fd %d", fd), fn)
}

// do runs fn in target; name says which namespace in errors.
func do(target netns.NsHandle, name string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		// fn may end the goroutine without returning (t.Fatal calls
		// runtime.Goexit): report that instead of leaving the caller
		// waiting forever. The thread stays locked, so the runtime ends it
		// rather than reuse it in the other namespace.
		reported := false
		defer func() {
			if !reported {
				errc <- fmt.Errorf("function run in network namespace %s exited without returning", name)
			}
		}()
		report := func(err error) { reported = true; errc <- err }
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			report(fmt.Errorf("reading current network namespace: %w", err))
			return
		}
		defer orig.Close()
		if err := netns.Set(target); err != nil {
			runtime.UnlockOSThread()
			report(fmt.Errorf("entering network namespace %s: %w", name, err))
			return
		}
		ferr := fn()
		if err := netns.Set(orig); err != nil {
			// Leave the thread locked: the runtime ends it with the goroutine.
			report(fmt.Errorf("returning from network namespace %s: %w", name, err))
			return
		}
		runtime.UnlockOSThread()
		report(ferr)
	}()
	return <-errc
}

// Open returns a file descriptor for the namespace at path; the caller closes it.
func Open(path string) (int, error) {
	h, err := netns.GetFromPath(path)
	if err != nil {
		return -1, fmt.Errorf("opening network namespace %s: %w", path, err)
	}
	return int(h), nil
}

// ProcSys is the directory whose net/ is the kernel's /proc/sys/net: the
// sysctls are read and written below it. On a host it is /proc/sys. In a
// container /proc/sys is mounted read-only and runc refuses any mount inside
// /proc, so the Helm chart mounts the host's /proc/sys/net at
// /host/proc/sys/net and starts the agent with -proc-sys /host/proc/sys. The
// mount point does not matter to the kernel: /proc/sys/net resolves against
// the network namespace of the thread that opens a file. Set once, before
// the first sysctl is read or written.
var ProcSys = "/proc/sys"

// WriteSysctl writes value to a /proc/sys/net key (dotted, e.g.
// "net.mptcp.path_manager") in the namespace at nsPath; "" means the
// caller's own namespace. /proc/sys/net resolves against the namespace of the
// thread that opens it, which is why the write runs inside Do.
func WriteSysctl(nsPath, key, value string) error {
	write := func() error {
		p := filepath.Join(ProcSys, filepath.FromSlash(dotsToSlashes(key)))
		if err := os.WriteFile(p, []byte(value), 0o644); err != nil {
			return fmt.Errorf("sysctl %s=%s: %w", key, value, err)
		}
		return nil
	}
	if nsPath == "" {
		return write()
	}
	return Do(nsPath, write)
}

// ReadSysctl reads a /proc/sys/net key in the namespace at nsPath.
func ReadSysctl(nsPath, key string) (string, error) {
	var out string
	read := func() error {
		b, err := os.ReadFile(filepath.Join(ProcSys, filepath.FromSlash(dotsToSlashes(key))))
		out = string(b)
		return err
	}
	var err error
	if nsPath == "" {
		err = read()
	} else {
		err = Do(nsPath, read)
	}
	for len(out) > 0 && (out[len(out)-1] == '\n') {
		out = out[:len(out)-1]
	}
	return out, err
}

// dotsToSlashes turns a sysctl key into its /proc/sys path. Interface names
// may contain dots, so only the dots of the fixed prefix are replaced for
// the per-interface keys net.ipv4.conf.<ifname>.<key>.
func dotsToSlashes(key string) string {
	const conf = "net.ipv4.conf."
	if len(key) > len(conf) && key[:len(conf)] == conf {
		rest := key[len(conf):]
		for i := len(rest) - 1; i >= 0; i-- {
			if rest[i] == '.' {
				return "net/ipv4/conf/" + rest[:i] + "/" + rest[i+1:]
			}
		}
	}
	b := []byte(key)
	for i := range b {
		if b[i] == '.' {
			b[i] = '/'
		}
	}
	return string(b)
}
