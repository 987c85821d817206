package stage2

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime/debug"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/cairn-os/cairn/api/machine"
	"github.com/cairn-os/cairn/init/internal/boot"
	"github.com/cairn-os/cairn/init/internal/containers"
	"github.com/cairn-os/cairn/internal/containerdconfig"
	"github.com/cairn-os/cairn/internal/layout"
	"github.com/cairn-os/cairn/supervisor"
)

// controlServer is init's side of the control socket, used by the agent.
type controlServer struct {
	machine.UnimplementedInitServer
	n *node
}

func (n *node) serveControl() error {
	_, err := n.listenControl(layout.InitSocket)
	return err
}

// listenControl serves the control socket at path, only for root, until
// the returned server is stopped.
func (n *node) listenControl(path string) (*grpc.Server, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, err
	}
	os.Remove(path)
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return nil, err
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(recoverUnary), grpc.StreamInterceptor(recoverStream))
	machine.RegisterInitServer(srv, &controlServer{n: n})
	boot.Go("control socket", func() {
		if err := srv.Serve(l); err != nil {
			slog.Error("control socket stopped", "err", err)
		}
	})
	return srv, nil
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

func recoverStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) (err error) {
	defer func() {
		if r := recover(); r != nil {
			slog.Error("panic in control handler", "method", info.FullMethod, "panic", r, "stack", string(debug.Stack()))
			err = status.Errorf(codes.Internal, "panic: %v", r)
		}
	}()
	return h(srv, ss)
}

func (c *controlServer) BootTimeline(context.Context, *machine.BootTimelineRequest) (*machine.BootTimelineResponse, error) {
	c.n.mu.Lock()
	keeper := c.n.timeKeeper
	c.n.mu.Unlock()
	resp := &machine.BootTimelineResponse{TimeSync: keeper.timeSync()}
	for _, r := range c.n.timeline.Records() {
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
	c.n.requestShutdown(unix.LINUX_REBOOT_CMD_RESTART, "control socket")
	return &machine.RebootResponse{}, nil
}

func (c *controlServer) Shutdown(context.Context, *machine.ShutdownRequest) (*machine.ShutdownResponse, error) {
	c.n.requestShutdown(unix.LINUX_REBOOT_CMD_POWER_OFF, "control socket")
	return &machine.ShutdownResponse{}, nil
}

// supervisor returns the service supervisor and the images of the
// image-backed services, or an error while there is none (no machine
// config, or still booting).
func (c *controlServer) supervisor() (*supervisor.Supervisor, map[string]string, error) {
	c.n.mu.Lock()
	defer c.n.mu.Unlock()
	if c.n.services == nil {
		msg := "no services are running: see the boot timeline (cairn node version)"
		if c.n.loadErr != nil {
			msg = fmt.Sprintf("no services are running: the machine config cannot be loaded: %v", c.n.loadErr)
		}
		return nil, nil, status.Error(codes.Unavailable, msg)
	}
	return c.n.services, c.n.images, nil
}

func (c *controlServer) Services(context.Context, *machine.ServicesRequest) (*machine.ServicesResponse, error) {
	sup, images, err := c.supervisor()
	if err != nil {
		return nil, err
	}
	resp := &machine.ServicesResponse{}
	for _, s := range sup.Status() {
		ps := &machine.ServiceStatus{
			Name:     s.Name,
			State:    string(s.State),
			Ready:    s.Ready,
			Restarts: uint32(s.Restarts),
			LastExit: s.LastExit,
			Reason:   s.Reason,
			Pid:      int32(s.Pid),
			Image:    images[s.Name],
		}
		if !s.Since.IsZero() {
			ps.Since = timestamppb.New(s.Since)
			ps.SinceBoot = durationpb.New(boot.SinceBoot() - time.Since(s.Since))
		}
		if !s.StartedAt.IsZero() {
			ps.StartedAt = timestamppb.New(s.StartedAt)
		}
		resp.Services = append(resp.Services, ps)
	}
	return resp, nil
}

func (c *controlServer) ServiceRestart(_ context.Context, req *machine.ServiceRestartRequest) (*machine.ServiceRestartResponse, error) {
	sup, _, err := c.supervisor()
	if err != nil {
		return nil, err
	}
	if err := sup.Restart(req.Name); err != nil {
		return nil, status.Error(codes.NotFound, err.Error())
	}
	return &machine.ServiceRestartResponse{}, nil
}

// ServiceKill signals a service's main process, as `kill` would: the
// supervisor sees a crash and applies the service's restart policy.
func (c *controlServer) ServiceKill(_ context.Context, req *machine.ServiceKillRequest) (*machine.ServiceKillResponse, error) {
	sup, _, err := c.supervisor()
	if err != nil {
		return nil, err
	}
	sig := unix.Signal(req.Signal)
	if sig == 0 {
		sig = unix.SIGKILL
	}
	for _, s := range sup.Status() {
		if s.Name != req.Name {
			continue
		}
		if s.Pid == 0 {
			return nil, status.Errorf(codes.FailedPrecondition, "%s is %s: no process to signal", s.Name, s.State)
		}
		if err := unix.Kill(s.Pid, sig); err != nil {
			return nil, status.Errorf(codes.Internal, "kill %s (pid %d): %v", s.Name, s.Pid, err)
		}
		return &machine.ServiceKillResponse{}, nil
	}
	return nil, status.Errorf(codes.NotFound, "no service %q", req.Name)
}

func (c *controlServer) Logs(req *machine.LogsRequest, stream grpc.ServerStreamingServer[machine.LogsChunk]) error {
	sup, _, err := c.supervisor()
	if err != nil {
		return err
	}
	if !req.Follow {
		data, err := sup.Logs(req.Service, int(req.TailLines))
		if err != nil {
			return status.Error(codes.NotFound, err.Error())
		}
		return stream.Send(&machine.LogsChunk{Data: data})
	}
	lines, err := sup.Follow(stream.Context(), req.Service, int(req.TailLines))
	if err != nil {
		return status.Error(codes.NotFound, err.Error())
	}
	for line := range lines {
		if err := stream.Send(&machine.LogsChunk{Data: line}); err != nil {
			return err
		}
	}
	return nil
}

func (c *controlServer) Containers(ctx context.Context, _ *machine.ContainersRequest) (*machine.ContainersResponse, error) {
	nss, err := containers.List(ctx, containerdconfig.Node.Socket)
	if err != nil {
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	return &machine.ContainersResponse{Namespaces: nss}, nil
}

// nodeConfigs returns the machine config's state, or an error while the
// boot has not loaded it yet.
func (c *controlServer) nodeConfigs() (*configs, error) {
	c.n.mu.Lock()
	defer c.n.mu.Unlock()
	if c.n.configs == nil {
		return nil, status.Error(codes.Unavailable, "the machine config is not loaded yet: see the boot timeline (cairn node version)")
	}
	return c.n.configs, nil
}

func (c *controlServer) ApplyConfig(_ context.Context, req *machine.ApplyConfigRequest) (*machine.ApplyConfigResponse, error) {
	cfgs, err := c.nodeConfigs()
	if err != nil {
		return nil, err
	}
	return cfgs.Apply(req)
}

func (c *controlServer) ConfirmConfig(context.Context, *machine.ConfirmConfigRequest) (*machine.ConfirmConfigResponse, error) {
	cfgs, err := c.nodeConfigs()
	if err != nil {
		return nil, err
	}
	return cfgs.Confirm()
}

func (c *controlServer) ConfigStatus(context.Context, *machine.ConfigStatusRequest) (*machine.ConfigState, error) {
	cfgs, err := c.nodeConfigs()
	if err != nil {
		return nil, err
	}
	return cfgs.Status(), nil
}

// nodeBoots returns the UKIs' state, or an error outside a node.
func (c *controlServer) nodeBoots() (*boots, error) {
	if c.n.boots == nil {
		return nil, status.Error(codes.Unavailable, "no boot entries: init does not run from a UKI")
	}
	return c.n.boots, nil
}

func (c *controlServer) Upgrade(stream grpc.BidiStreamingServer[machine.UpgradeRequest, machine.UpgradeProgress]) error {
	b, err := c.nodeBoots()
	if err != nil {
		return err
	}
	return b.Upgrade(stream)
}

func (c *controlServer) Rollback(context.Context, *machine.RollbackRequest) (*machine.RollbackResponse, error) {
	b, err := c.nodeBoots()
	if err != nil {
		return nil, err
	}
	return b.Rollback("asked through the API (cairn node rollback)")
}

func (c *controlServer) BootStatus(context.Context, *machine.BootStatusRequest) (*machine.BootState, error) {
	b, err := c.nodeBoots()
	if err != nil {
		return nil, err
	}
	return b.Status(), nil
}

func (c *controlServer) Reset(_ context.Context, req *machine.ResetRequest) (*machine.ResetResponse, error) {
	return c.n.reset(req)
}

func (c *controlServer) Events(req *machine.EventsRequest, stream grpc.ServerStreamingServer[machine.Event]) error {
	return c.n.events.stream(req, stream)
}
