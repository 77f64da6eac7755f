// Command pause is a throwaway sandbox ("pause") image's program for the test
// bed's real nodes: it holds the pod's namespaces and waits to be told to
// stop. `make images` (issue 14, item 1) replaces it with the project's own.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	<-stop
}
