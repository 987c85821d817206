package main

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/cairn-os/cairn/api/client"
	"github.com/cairn-os/cairn/machineconfig"
)

func metricsCmd(f *nodeFlags) *cobra.Command {
	port := machineconfig.DefaultMetricsPort
	cmd := &cobra.Command{
		Use:   "metrics",
		Short: "Print the node's Prometheus metrics",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return f.onNodes(cmd, callTimeout, func(ctx context.Context, n *target) error {
				if err := client.Metrics(ctx, n.Config, n.Endpoint, port, n.Out); err != nil {
					return fmt.Errorf("%w (is machine.api.metricsPort %d? under `cairn qemu run`, --metrics-port forwards it)", err, port)
				}
				return nil
			})
		},
	}
	cmd.Flags().IntVar(&port, "port", port, "the node's metrics port (machine.api.metricsPort)")
	return cmd
}
