// Command cairn-agent is the node agent of Cairn. It serves the management
// API over mutual TLS and asks init, over its control socket, for what only
// PID 1 may do (reboot, shutdown).
package main

import (
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"

	"github.com/cairn-os/cairn/agent/api"
	"github.com/cairn-os/cairn/machineconfig"
)

func main() {
	configPath := flag.String("config", "/system/state/config.yaml", "machine config")
	initSocket := flag.String("init-socket", "/run/cairn/init.sock", "init's control socket")
	flag.Parse()
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, nil)))
	if err := run(*configPath, *initSocket); err != nil {
		slog.Error("cairn-agent failed", "err", err)
		os.Exit(1)
	}
}

func run(configPath, initSocket string) error {
	cfg, err := machineconfig.Load(configPath)
	if err != nil {
		return err
	}
	initc, err := api.DialInit(initSocket)
	if err != nil {
		return err
	}
	defer initc.Close()
	srv, err := api.NewServer(cfg, initc)
	if err != nil {
		return err
	}
	addr := fmt.Sprintf(":%d", cfg.Machine.API.Port)
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", addr, err)
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-sigs
		slog.Info("stopping: finishing calls in flight")
		srv.GracefulStop()
	}()
	slog.Info("management API listening", "addr", addr)
	return srv.Serve(l)
}
