// Command cairn is the operator's tool for Cairn nodes: it generates and
// validates machine configs, builds disk images, boots them in QEMU and
// manages running nodes through their API.
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
)

func main() {
	if err := rootCmd().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}

func rootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:           "cairn",
		Short:         "Build, boot and manage Cairn nodes",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(configCmd(), imageCmd(), qemuCmd(), nodeCmd())
	return root
}
