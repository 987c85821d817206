// Command brokennode stands in for the node binary in the UKI of a broken
// upgrade: init and containerd as in the real one, and an agent that exits
// at once, so that the node never becomes healthy and the upgrade rolls
// back by itself.
package main

import (
	"fmt"
	"os"
	"path"
	"path/filepath"

	"github.com/cairn-os/cairn/init/stage2"
	"github.com/cairn-os/cairn/internal/layout"
	"github.com/cairn-os/cairn/rootfs/containerd"
)

func main() {
	switch filepath.Base(os.Args[0]) {
	case path.Base(layout.InitBinary):
		stage2.Main()
	case path.Base(layout.ContainerdBinary):
		containerd.Main()
	default:
		fmt.Fprintln(os.Stderr, "cairn-agent of a UKI built broken for the rollback test: exiting")
		os.Exit(1)
	}
}
