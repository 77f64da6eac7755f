package guest

import (
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/cavaliergopher/cpio"
)

// AssetsEnv names the directory hack/guest-assets.sh fills: the guest
// kernel (vmlinuz) and the modules its network driver needs
// (modules/*.ko, loaded in the order modules/order lists).
const AssetsEnv = "MPTCP_GUEST_ASSETS"

// Assets is the guest kernel's directory, from AssetsEnv.
func Assets() (string, error) {
	dir := os.Getenv(AssetsEnv)
	if dir == "" {
		return "", fmt.Errorf("%s is not set: `make guest-assets` fills the directory and `make test` sets it", AssetsEnv)
	}
	for _, f := range []string{"vmlinuz", "modules/order"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			return "", fmt.Errorf("guest assets in %s: %w (make guest-assets)", dir, err)
		}
	}
	return dir, nil
}

// Image is what QEMU boots: a kernel and an initramfs.
type Image struct {
	Kernel, Initramfs string
}

// programs are what the image runs, built static from this tree: guestd
// as the guest's init, and the bed's traffic tool.
var programs = map[string]string{
	"init":        "github.com/mptcp-operator/mptcp-operator/test/testbed/guest/guestd",
	"bin/traffic": "github.com/mptcp-operator/mptcp-operator/hack/traffic",
}

// BuildImage writes into dir an initramfs holding programs, and extra ones
// (path in the image to Go package), and the modules of assets, and returns
// it with the kernel of assets.
func BuildImage(assets, dir string, extra map[string]string) (Image, error) {
	img := Image{Kernel: filepath.Join(assets, "vmlinuz"), Initramfs: filepath.Join(dir, "initramfs.cpio.gz")}
	files := map[string]string{"lib/modules/order": filepath.Join(assets, "modules", "order")}
	all := maps.Clone(programs)
	maps.Copy(all, extra)
	for name, pkg := range all {
		bin := filepath.Join(dir, filepath.Base(name))
		build := exec.Command("go", "build", "-trimpath", "-o", bin, pkg)
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := build.CombinedOutput(); err != nil {
			return img, fmt.Errorf("building %s for the guest: %w: %s", pkg, err, out)
		}
		files[name] = bin
	}
	order, err := os.ReadFile(filepath.Join(assets, "modules", "order"))
	if err != nil {
		return img, err
	}
	for _, m := range strings.Fields(string(order)) {
		files["lib/modules/"+m] = filepath.Join(assets, "modules", m)
	}
	f, err := os.Create(img.Initramfs)
	if err != nil {
		return img, err
	}
	err = writeInitramfs(f, files)
	return img, errors.Join(err, f.Close())
}

// writeInitramfs writes a gzipped newc archive of the directories the
// guest mounts on and files (archive name to host path).
func writeInitramfs(out io.Writer, files map[string]string) error {
	zw := gzip.NewWriter(out)
	w := cpio.NewWriter(zw)
	for _, d := range []string{"bin", "dev", "lib", "lib/modules", "proc", "sys", "tmp"} {
		if err := w.WriteHeader(&cpio.Header{Name: d, Mode: cpio.TypeDir | 0o755}); err != nil {
			return err
		}
	}
	for name, path := range files {
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if err := w.WriteHeader(&cpio.Header{Name: name, Mode: cpio.TypeReg | 0o755, Size: int64(len(data))}); err != nil {
			return err
		}
		if _, err := w.Write(data); err != nil {
			return err
		}
	}
	return errors.Join(w.Close(), zw.Close())
}
