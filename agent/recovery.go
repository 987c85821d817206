package agent

import (
	"fmt"
	"log/slog"

	"github.com/cairn-os/cairn/machineconfig"
)

// loadConfig loads the machine config at path. When it cannot, the agent
// serves the management API in recovery mode, as init runs the node: with
// what machineconfig.Recover salvages from the file, so that an operator
// can reach the node and read why (the boot timeline holds the load error).
// The recovered config has no cluster section: the kubelet part stays off.
// Without usable API credentials there is nothing to serve.
func loadConfig(path string) (*machineconfig.Config, error) {
	cfg, err := machineconfig.Load(path)
	if err == nil {
		return cfg, nil
	}
	rec, _ := machineconfig.RecoverFile(path) // its read error is err's
	if !rec.API {
		return nil, fmt.Errorf("%w; no usable machine.api credentials in it either, so no management API can be served", err)
	}
	slog.Warn("machine config not loaded: serving the management API in recovery mode, the kubelet part off", "err", err, "salvaged", rec.Salvaged)
	return rec.Config, nil
}
