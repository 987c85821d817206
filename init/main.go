// Command init is the node binary of Cairn: one program, hard-linked under
// the names layout.InitBinary, layout.AgentBinary and
// layout.ContainerdBinary, that runs as the one it is called by: init
// (init/stage2, PID 1 in the node's real root), the node agent (agent) or
// containerd (rootfs/containerd). One binary for the three keeps the UKI
// small, as Talos's machined does for its services.
package main

import (
	"fmt"
	"os"
	"path"
	"path/filepath"

	"github.com/cairn-os/cairn/agent"
	"github.com/cairn-os/cairn/init/stage2"
	"github.com/cairn-os/cairn/internal/layout"
	"github.com/cairn-os/cairn/rootfs/containerd"
)

func main() {
	switch name := filepath.Base(os.Args[0]); name {
	case path.Base(layout.InitBinary):
		stage2.Main()
	case path.Base(layout.AgentBinary):
		agent.Main()
	case path.Base(layout.ContainerdBinary):
		containerd.Main()
	default:
		fmt.Fprintf(os.Stderr, "the Cairn node binary runs as %s, %s or %s, by the name it is called by, not as %s\n",
			path.Base(layout.InitBinary), path.Base(layout.AgentBinary), path.Base(layout.ContainerdBinary), name)
		os.Exit(2)
	}
}
