package agent

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/cairn-os/cairn/agent/api"
	"github.com/cairn-os/cairn/machineconfig"
)

// configResync is how often the running config is read again even when no
// change to it was seen.
const configResync = time.Minute

// followConfig hands apply the running machine config at path, which init
// replaces whole when a config is applied live: now, at each change, and
// every configResync, until ctx ends or apply fails. A config that does
// not load is skipped: init writes only valid ones.
func followConfig(ctx context.Context, path string, apply func(*machineconfig.Config) error) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watch the running machine config: %w", err)
	}
	defer w.Close()
	if err := w.Add(filepath.Dir(path)); err != nil {
		return fmt.Errorf("watch the running machine config: %w", err)
	}
	tick := time.NewTicker(configResync)
	defer tick.Stop()
	for {
		if cfg, err := machineconfig.Load(path); err == nil {
			if err := apply(cfg); err != nil {
				return err
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		case e := <-w.Events:
			if e.Name != path {
				continue
			}
		case err := <-w.Errors:
			return fmt.Errorf("watch the running machine config: %w", err)
		}
	}
}

// followAPICredentials keeps creds those of machine.api in the running
// config at path: certificates and CA changed by a config applied live
// serve the next connections. running is what creds hold now.
func followAPICredentials(ctx context.Context, path string, creds *api.Credentials, running machineconfig.API) error {
	return followConfig(ctx, path, func(cfg *machineconfig.Config) error {
		next := cfg.Machine.API
		if next.CA == running.CA && next.Cert == running.Cert && next.Key == running.Key {
			return nil
		}
		if err := creds.Update(&next); err != nil {
			slog.Error("machine.api credentials not loaded: the API keeps serving with the current ones", "err", err)
			return nil
		}
		slog.Info("machine.api credentials replaced: new connections get them")
		running = next
		return nil
	})
}
