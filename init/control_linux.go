package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime/debug"

	"github.com/cairn-os/cairn/api/machine"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// controlServer is init's side of the control socket, used by the agent.
type controlServer struct {
	machine.UnimplementedInitServer
	n *node
}

func (n *node) serveControl() error {
	if err := os.MkdirAll(filepath.Dir(controlSock), 0o700); err != nil {
		return err
	}
	os.Remove(controlSock)
	l, err := net.Listen("unix", controlSock)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", controlSock, err)
	}
	if err := os.Chmod(controlSock, 0o600); err != nil {
		return err
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(recoverUnary))
	machine.RegisterInitServer(srv, &controlServer{n: n})
	go func() {
		if err := srv.Serve(l); err != nil {
			slog.Error("control socket stopped", "err", err)
		}
	}()
	return nil
}

// recoverUnary turns a panic in a handler into an error: PID 1 must not die.
func recoverUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (resp any, err error) {
	defer func() {
		if r := recover(); r != nil {
			slog.Error("panic in control handler", "method", info.FullMethod, "panic", r, "stack", string(debug.Stack()))
			err = status.Errorf(codes.Internal, "panic: %v", r)
		}
	}()
	return h(ctx, req)
}

func (c *controlServer) BootTimeline(context.Context, *machine.BootTimelineRequest) (*machine.BootTimelineResponse, error) {
	c.n.mu.Lock()
	defer c.n.mu.Unlock()
	resp := &machine.BootTimelineResponse{}
	for _, r := range c.n.timeline {
		resp.Steps = append(resp.Steps, &machine.BootStep{
			Name:     r.Name,
			Start:    durationpb.New(r.Start),
			Duration: durationpb.New(r.Duration),
			Error:    r.Err,
		})
	}
	return resp, nil
}

func (c *controlServer) Reboot(context.Context, *machine.RebootRequest) (*machine.RebootResponse, error) {
	go c.n.shutdown(unix.LINUX_REBOOT_CMD_RESTART)
	return &machine.RebootResponse{}, nil
}

func (c *controlServer) Shutdown(context.Context, *machine.ShutdownRequest) (*machine.ShutdownResponse, error) {
	go c.n.shutdown(unix.LINUX_REBOOT_CMD_POWER_OFF)
	return &machine.ShutdownResponse{}, nil
}
