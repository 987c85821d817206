// Package api serves the management API of a Cairn node: gRPC over mutual
// TLS, every caller identified by its client certificate and allowed by its
// role (admin, operator, reader), every call but a reader's audited.
package api

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/cairn-os/cairn/agent/drain"
	"github.com/cairn-os/cairn/api/machine"
	"github.com/cairn-os/cairn/internal/version"
	"github.com/cairn-os/cairn/supervisor"
)

// InitClient is the agent's connection to init's control socket.
type InitClient struct {
	machine.InitClient
	conn *grpc.ClientConn
}

// DialInit connects to init's control socket at path.
func DialInit(path string) (*InitClient, error) {
	conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("dial init at %s: %w", path, err)
	}
	return &InitClient{InitClient: machine.NewInitClient(conn), conn: conn}, nil
}

// Close closes the connection.
func (c *InitClient) Close() error { return c.conn.Close() }

// NewServer returns the gRPC server of the management API, with creds
// (which may change while it serves). podLogRoot holds the pods'
// container logs, /var/log/pods on a node.
func NewServer(creds *Credentials, init machine.InitClient, drainer Drainer, podLogRoot string) *grpc.Server {
	audit := newAuditLog(slog.Default(), auditRingSize)
	srv := grpc.NewServer(
		grpc.Creds(credentials.NewTLS(creds.ServerConfig("h2"))),
		grpc.ChainUnaryInterceptor(audit.unary, authorizeUnary),
		grpc.ChainStreamInterceptor(audit.stream, authorizeStream),
	)
	machine.RegisterMachineServer(srv, &machineServer{init: init, drainer: drainer, podLogRoot: podLogRoot, audit: audit})
	return srv
}

// Drainer empties the node of its pods before it goes away (agent/drain).
type Drainer interface {
	// Joined says whether the node is in its cluster now.
	Joined() bool
	Drain(context.Context, drain.Options) error
	// Undo uncordons the Node after a drain whose reboot did not come.
	Undo(context.Context) error
	// Leave deletes the Node if the cluster lets the node, and says what
	// became of it.
	Leave(context.Context) string
}

type machineServer struct {
	machine.UnimplementedMachineServer
	init       machine.InitClient
	drainer    Drainer
	podLogRoot string
	audit      *auditLog
}

func (s *machineServer) Version(ctx context.Context, _ *machine.VersionRequest) (*machine.VersionResponse, error) {
	resp := &machine.VersionResponse{CairnVersion: version.Version}
	var u unix.Utsname
	if err := unix.Uname(&u); err == nil {
		resp.Kernel = unix.ByteSliceToString(u.Release[:])
	}
	resp.Hostname, _ = os.Hostname()
	resp.Addresses = addresses()
	resp.Uptime = durationpb.New(uptime())
	tl, err := s.init.BootTimeline(ctx, &machine.BootTimelineRequest{})
	if err != nil {
		return nil, fmt.Errorf("boot timeline from init: %w", err)
	}
	resp.BootTimeline = tl.Steps
	resp.TimeSync = tl.TimeSync
	if resp.Config, err = s.init.ConfigStatus(ctx, &machine.ConfigStatusRequest{}); err != nil {
		return nil, fmt.Errorf("machine config state from init: %w", err)
	}
	if resp.Boot, err = s.init.BootStatus(ctx, &machine.BootStatusRequest{}); err != nil {
		return nil, fmt.Errorf("boot state from init: %w", err)
	}
	return resp, nil
}

// Upgrades and rollbacks are init's: it owns the EFI system partition.

// Upgrade relays the caller's stream to init and init's progress back. In
// a cluster, unless the caller says not to, the node drains once init has
// verified the UKI and before init writes it (the header holds init): a
// drain that fails leaves the node as it was, nothing written.
func (s *machineServer) Upgrade(stream grpc.BidiStreamingServer[machine.UpgradeRequest, machine.UpgradeProgress]) error {
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	h := first.GetHeader()
	// Staged, the reboot is someone else's, later: no drain now.
	wantsDrain := h != nil && !h.Stage && !h.GetDrain().GetSkip()
	drains := wantsDrain && s.drainer.Joined()
	if h != nil {
		h.Hold = drains // init's to hear from the agent alone
	}
	up, err := s.init.Upgrade(ctx)
	if err != nil {
		return err
	}
	var sendMu sync.Mutex // the relay below and the proceed after the drain
	send := func(req *machine.UpgradeRequest) error {
		sendMu.Lock()
		defer sendMu.Unlock()
		return up.Send(req)
	}
	if err := send(first); err != nil {
		return err
	}
	go func() {
		for {
			req, err := stream.Recv()
			if err == io.EOF {
				if !drains { // held, init waits for proceed, not the end
					sendMu.Lock()
					up.CloseSend()
					sendMu.Unlock()
				}
				return
			}
			if err != nil {
				cancel() // the caller went away: so does init's side
				return
			}
			if send(req) != nil {
				return // init's error comes from Recv
			}
		}
	}()
	drained, rebooting := false, false
	for {
		p, err := up.Recv()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			// Once rebooting, the Node stays cordoned: the node
			// uncordons it when back (agent/drain's marker).
			if drained && !rebooting {
				err = errors.Join(err, s.drainer.Undo(context.WithoutCancel(ctx)))
			}
			return err
		}
		rebooting = rebooting || p.Step == "rebooting"
		if err := stream.Send(p); err != nil {
			return err
		}
		if p.Step != "verified" || !wantsDrain {
			continue
		}
		if !drains {
			stream.Send(&machine.UpgradeProgress{Step: "verified", Message: "not drained: the node is not in a cluster now", Version: p.Version})
			continue
		}
		if err := s.drainer.Drain(ctx, drainOptions(h.Drain, func(step, msg string) {
			stream.Send(&machine.UpgradeProgress{Step: step, Message: msg, Version: p.Version})
		})); err != nil {
			return status.Errorf(codes.FailedPrecondition, "upgrade to %s refused, nothing written, the Node as it was: %v", p.Version, err)
		}
		drained = true
		if err := send(&machine.UpgradeRequest{Part: &machine.UpgradeRequest_Proceed{Proceed: true}}); err != nil {
			return errors.Join(err, s.drainer.Undo(context.WithoutCancel(ctx)))
		}
	}
}

func drainOptions(o *machine.DrainOptions, progress func(step, msg string)) drain.Options {
	return drain.Options{Timeout: o.GetTimeout().AsDuration(), Force: o.GetForce(), Progress: progress}
}

// Reset, graceful, drains the node first and deletes its Node where the
// cluster lets a node do so.
func (s *machineServer) Reset(ctx context.Context, req *machine.ResetRequest) (*machine.ResetResponse, error) {
	var outcome []string
	if req.Graceful {
		if !s.drainer.Joined() {
			return nil, status.Error(codes.FailedPrecondition, "graceful reset refused: the node is not in its cluster now, so it cannot drain; reset without --graceful")
		}
		if err := s.drainer.Drain(ctx, drainOptions(req.Drain, nil)); err != nil {
			return nil, status.Errorf(codes.FailedPrecondition, "graceful reset refused, the Node as it was: %v", err)
		}
		outcome = append(outcome, "drained", s.drainer.Leave(ctx))
	}
	resp, err := s.init.Reset(ctx, req)
	if err != nil {
		if req.Graceful {
			err = errors.Join(err, s.drainer.Undo(context.WithoutCancel(ctx)))
		}
		return nil, err
	}
	resp.Outcome = strings.Join(append(outcome, resp.Outcome), "; ")
	return resp, nil
}

func (s *machineServer) Rollback(ctx context.Context, req *machine.RollbackRequest) (*machine.RollbackResponse, error) {
	return s.init.Rollback(ctx, req)
}

// The machine config is init's, which writes it to STATE and applies it.

func (s *machineServer) ApplyConfig(ctx context.Context, req *machine.ApplyConfigRequest) (*machine.ApplyConfigResponse, error) {
	return s.init.ApplyConfig(ctx, req)
}

func (s *machineServer) ConfirmConfig(ctx context.Context, req *machine.ConfirmConfigRequest) (*machine.ConfirmConfigResponse, error) {
	return s.init.ConfirmConfig(ctx, req)
}

func (s *machineServer) Reboot(ctx context.Context, req *machine.RebootRequest) (*machine.RebootResponse, error) {
	return s.init.Reboot(ctx, req)
}

func (s *machineServer) Shutdown(ctx context.Context, req *machine.ShutdownRequest) (*machine.ShutdownResponse, error) {
	return s.init.Shutdown(ctx, req)
}

// The service calls are init's to answer: it owns the supervisor.

// Services adds to init's answer the limits of each service's cgroup, read
// back from the kernel: what is enforced, not what was asked for.
func (s *machineServer) Services(ctx context.Context, req *machine.ServicesRequest) (*machine.ServicesResponse, error) {
	resp, err := s.init.Services(ctx, req)
	if err != nil {
		return nil, err
	}
	for _, svc := range resp.Services {
		if svc.Pid <= 0 {
			continue
		}
		l, err := supervisor.ProcessLimits(cgroupRoot, int(svc.Pid))
		if err != nil {
			continue // the process ended meanwhile, or no cgroup v2
		}
		svc.Limits = &machine.CgroupLimits{Cgroup: l.Cgroup, MemoryMax: l.MemoryMax, CpuMax: l.CPUMax, CpuWeight: l.CPUWeight, PidsMax: l.PidsMax}
	}
	return resp, nil
}

// cgroupRoot is where init mounts cgroup2 on a node.
var cgroupRoot = "/sys/fs/cgroup"

func (s *machineServer) ServiceRestart(ctx context.Context, req *machine.ServiceRestartRequest) (*machine.ServiceRestartResponse, error) {
	return s.init.ServiceRestart(ctx, req)
}

func (s *machineServer) ServiceKill(ctx context.Context, req *machine.ServiceKillRequest) (*machine.ServiceKillResponse, error) {
	return s.init.ServiceKill(ctx, req)
}

func (s *machineServer) Containers(ctx context.Context, req *machine.ContainersRequest) (*machine.ContainersResponse, error) {
	return s.init.Containers(ctx, req)
}

// Logs relays init's log stream to the client until either side ends it.
func (s *machineServer) Logs(req *machine.LogsRequest, stream grpc.ServerStreamingServer[machine.LogsChunk]) error {
	from, err := s.init.Logs(stream.Context(), req)
	if err != nil {
		return err
	}
	for {
		chunk, err := from.Recv()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if err := stream.Send(chunk); err != nil {
			return err
		}
	}
}

// addresses lists the node's interface addresses, loopback excluded.
func addresses() []string {
	var out []string
	ifaces, _ := net.Interfaces()
	for _, ifc := range ifaces {
		if ifc.Flags&net.FlagLoopback != 0 {
			continue
		}
		addrs, _ := ifc.Addrs()
		for _, a := range addrs {
			out = append(out, a.String())
		}
	}
	return out
}

// uptime reads the time since boot from /proc/uptime.
func uptime() time.Duration {
	raw, err := os.ReadFile("/proc/uptime")
	if err != nil {
		return 0
	}
	f, _, _ := strings.Cut(string(raw), " ")
	secs, err := strconv.ParseFloat(f, 64)
	if err != nil {
		return 0
	}
	return time.Duration(secs * float64(time.Second))
}
