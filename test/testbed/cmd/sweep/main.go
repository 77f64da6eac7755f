// Command sweep removes test beds (test/testbed) left behind by crashed or killed runs: their processes, network
// namespaces and pin directories. Beds whose owning process still runs are kept. With -prefix it removes that one
// bed whatever its owner.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/mptcp-operator/mptcp-operator/test/testbed"
)

func main() {
	prefix := flag.String("prefix", "", "remove the bed with this prefix (e.g. mpt1a2b3c) even if its owner runs")
	flag.Parse()
	var err error
	if *prefix != "" {
		err = testbed.Sweep(*prefix)
	} else {
		err = testbed.SweepStale()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "sweep:", err)
		os.Exit(1)
	}
}
