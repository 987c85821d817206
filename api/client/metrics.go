package client

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"

	"github.com/cairn-os/cairn/machineconfig"
)

// Metrics copies the Prometheus metrics of the node whose API is at
// endpoint (host:port) to w: GET /metrics on the same host's metricsPort
// (machine.api.metricsPort), over mutual TLS with cc's certificate.
func Metrics(ctx context.Context, cc *machineconfig.ClientConfig, endpoint string, metricsPort int, w io.Writer) error {
	host, _, err := net.SplitHostPort(endpoint)
	if err != nil {
		return fmt.Errorf("endpoint %q: want host:port: %w", endpoint, err)
	}
	tlsCfg, err := cc.TLSConfig(host)
	if err != nil {
		return err
	}
	url := "https://" + net.JoinHostPort(host, strconv.Itoa(metricsPort)) + "/metrics"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	transport := &http.Transport{TLSClientConfig: tlsCfg}
	defer transport.CloseIdleConnections()
	resp, err := (&http.Client{Transport: transport}).Do(req)
	if err != nil {
		return fmt.Errorf("GET %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	_, err = io.Copy(w, resp.Body)
	return err
}
