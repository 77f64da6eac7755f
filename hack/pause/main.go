// Command pause is the sandbox ("pause") container of pods on the test bed's
// nodes: it holds the pod's namespaces open and does nothing else until it is
// told to stop. containerd needs a sandbox image; there is no registry to pull
// the usual one from, so `make images` builds this one next to the product's.
//
// As PID 1 of a pod that shares its process namespace it also reaps the
// orphans the pod's other processes leave behind, as the kubelet's pause does.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	children := make(chan os.Signal, 1)
	signal.Notify(children, syscall.SIGCHLD)
	for {
		select {
		case <-stop:
			return
		case <-children:
			reap()
		}
	}
}

// reap collects every child that has exited, without blocking on those that
// still run.
func reap() {
	for {
		pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}
