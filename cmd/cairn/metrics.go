package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/cairn-os/cairn/machineconfig"
)

func metricsCmd(f *nodeFlags) *cobra.Command {
	port := machineconfig.DefaultMetricsPort
	cmd := &cobra.Command{
		Use:   "metrics",
		Short: "Print the node's Prometheus metrics",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), 30*time.Second)
			defer cancel()
			return scrapeMetrics(ctx, f, port, cmd.OutOrStdout())
		},
	}
	cmd.Flags().IntVar(&port, "port", port, "the node's metrics port (machine.api.metricsPort)")
	return cmd
}

// scrapeMetrics GETs /metrics from the node's host on port, with the
// client config's certificate, and copies it to w.
func scrapeMetrics(ctx context.Context, f *nodeFlags, port int, w io.Writer) error {
	cc, endpoint, err := f.clientConfig()
	if err != nil {
		return err
	}
	host, _, err := net.SplitHostPort(endpoint)
	if err != nil {
		return fmt.Errorf("endpoint %q: %w", endpoint, err)
	}
	tlsCfg, err := cc.TLSConfig(host)
	if err != nil {
		return err
	}
	url := "https://" + net.JoinHostPort(host, strconv.Itoa(port)) + "/metrics"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := (&http.Client{Transport: &http.Transport{TLSClientConfig: tlsCfg}}).Do(req)
	if err != nil {
		return fmt.Errorf("%w (is machine.api.metricsPort %d? under `cairn qemu run`, --metrics-port forwards it)", err, port)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	_, err = io.Copy(w, resp.Body)
	return err
}
