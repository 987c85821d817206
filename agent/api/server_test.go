package api

import (
	"context"
	"crypto/x509"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cairn-os/cairn/agent/drain"
	"github.com/cairn-os/cairn/test/tlsprobe"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/cairn-os/cairn/api/client"
	"github.com/cairn-os/cairn/api/machine"
	"github.com/cairn-os/cairn/machineconfig"
	"github.com/cairn-os/cairn/test/need"
)

// recordingInit stands in for init's control socket, which only PID 1
// serves: it records what the agent forwards.
type recordingInit struct {
	machine.InitClient
	reboots, shutdowns int
	applies, rollbacks int
	resets             int
	timelines          atomic.Int32 // BootTimeline calls: one per Version
}

func (r *recordingInit) BootTimeline(context.Context, *machine.BootTimelineRequest, ...grpc.CallOption) (*machine.BootTimelineResponse, error) {
	r.timelines.Add(1)
	return &machine.BootTimelineResponse{Steps: []*machine.BootStep{{Name: "mount STATE"}}, TimeSync: &machine.TimeSync{Synced: true, Server: "time.example.com"}}, nil
}

func (r *recordingInit) ConfigStatus(context.Context, *machine.ConfigStatusRequest, ...grpc.CallOption) (*machine.ConfigState, error) {
	return &machine.ConfigState{Generation: 3, BootGeneration: 4}, nil
}

func (r *recordingInit) BootStatus(context.Context, *machine.BootStatusRequest, ...grpc.CallOption) (*machine.BootState, error) {
	return &machine.BootState{Entry: "cairn-0.1.0.efi", Blessed: true}, nil
}

func (r *recordingInit) Rollback(context.Context, *machine.RollbackRequest, ...grpc.CallOption) (*machine.RollbackResponse, error) {
	r.rollbacks++
	return &machine.RollbackResponse{From: "0.2.0", To: "0.1.0"}, nil
}

// Events sends two events of init's, older than any call of the test.
func (r *recordingInit) Events(ctx context.Context, req *machine.EventsRequest, _ ...grpc.CallOption) (grpc.ServerStreamingClient[machine.Event], error) {
	start := time.Now().Add(-time.Minute)
	return &eventStream{ctx: ctx, events: []*machine.Event{
		{Time: timestamppb.New(start), Kind: "step", Subject: "mount STATE", Message: "done in 20ms"},
		{Time: timestamppb.New(start.Add(time.Second)), Kind: "service", Subject: "containerd", Message: "Running"},
	}}, nil
}

// eventStream is a finished stream of events.
type eventStream struct {
	grpc.ClientStream
	ctx    context.Context
	events []*machine.Event
}

func (s *eventStream) Recv() (*machine.Event, error) {
	if len(s.events) == 0 {
		return nil, io.EOF
	}
	e := s.events[0]
	s.events = s.events[1:]
	return e, nil
}

func (r *recordingInit) Reset(context.Context, *machine.ResetRequest, ...grpc.CallOption) (*machine.ResetResponse, error) {
	r.resets++
	return &machine.ResetResponse{}, nil
}

func (r *recordingInit) ApplyConfig(_ context.Context, req *machine.ApplyConfigRequest, _ ...grpc.CallOption) (*machine.ApplyConfigResponse, error) {
	r.applies++
	return &machine.ApplyConfigResponse{Outcome: "applied live", Generation: 5}, nil
}

func (r *recordingInit) Reboot(context.Context, *machine.RebootRequest, ...grpc.CallOption) (*machine.RebootResponse, error) {
	r.reboots++
	return &machine.RebootResponse{}, nil
}

func (r *recordingInit) Shutdown(context.Context, *machine.ShutdownRequest, ...grpc.CallOption) (*machine.ShutdownResponse, error) {
	r.shutdowns++
	return &machine.ShutdownResponse{}, nil
}

// serve starts the API on loopback, with the pods' logs under podLogRoot,
// and returns the bundle whose CA signs it.
func serve(t *testing.T, init machine.InitClient, podLogRoot string) (*machineconfig.Bundle, string) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	endpoint := l.Addr().String()
	b, err := machineconfig.Generate(machineconfig.GenerateOptions{Hostname: "unit", Endpoints: []string{endpoint}, Now: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	creds, err := NewCredentials(&b.Config.Machine.API)
	srv := NewServer(creds, init, drain.New(filepath.Join(t.TempDir(), "drain.json"), slog.Default()), podLogRoot)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(l)
	t.Cleanup(srv.Stop)
	return b, endpoint
}

// clientWithRole issues a client certificate with role from b's CA.
func clientWithRole(t *testing.T, b *machineconfig.Bundle, endpoint, role string) *client.Client {
	t.Helper()
	cert, key, err := b.CA.IssueClient("test-"+role, role, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	cc := *b.Client
	cc.Cert, cc.Key = string(cert), string(key)
	c, err := client.Dial(&cc, endpoint)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestRoles(t *testing.T) {
	init := &recordingInit{}
	b, endpoint := serve(t, init, "")
	ctx := context.Background()
	tests := []struct {
		role               string
		wantVersion        codes.Code
		wantReboot, wantSD codes.Code
		wantApply          codes.Code
	}{
		{machineconfig.RoleReader, codes.OK, codes.PermissionDenied, codes.PermissionDenied, codes.PermissionDenied},
		{machineconfig.RoleOperator, codes.OK, codes.OK, codes.OK, codes.OK},
		{machineconfig.RoleAdmin, codes.OK, codes.OK, codes.OK, codes.OK},
	}
	for _, tt := range tests {
		c := clientWithRole(t, b, endpoint, tt.role)
		v, err := c.Version(ctx, &machine.VersionRequest{})
		if status.Code(err) != tt.wantVersion {
			t.Errorf("%s: Version() = %v, want %v", tt.role, err, tt.wantVersion)
		}
		if err == nil && (len(v.BootTimeline) != 1 || v.Kernel == "" || v.TimeSync.GetServer() != "time.example.com" || v.Config.GetBootGeneration() != 4 || v.Boot.GetEntry() != "cairn-0.1.0.efi") {
			t.Errorf("%s: Version() = %v, want the kernel, init's boot timeline, time sync, config and boot state", tt.role, v)
		}
		if _, err := c.Rollback(ctx, &machine.RollbackRequest{}); status.Code(err) != tt.wantApply {
			t.Errorf("%s: Rollback() = %v, want %v", tt.role, err, tt.wantApply)
		}
		wantReset := codes.PermissionDenied
		if tt.role == machineconfig.RoleAdmin {
			wantReset = codes.OK
		}
		if _, err := c.Reset(ctx, &machine.ResetRequest{}); status.Code(err) != wantReset {
			t.Errorf("%s: Reset() = %v, want %v", tt.role, err, wantReset)
		}
		if _, err := c.ApplyConfig(ctx, &machine.ApplyConfigRequest{Config: []byte("x")}); status.Code(err) != tt.wantApply {
			t.Errorf("%s: ApplyConfig() = %v, want %v", tt.role, err, tt.wantApply)
		}
		if _, err := c.Reboot(ctx, &machine.RebootRequest{}); status.Code(err) != tt.wantReboot {
			t.Errorf("%s: Reboot() = %v, want %v", tt.role, err, tt.wantReboot)
		}
		if _, err := c.Shutdown(ctx, &machine.ShutdownRequest{}); status.Code(err) != tt.wantSD {
			t.Errorf("%s: Shutdown() = %v, want %v", tt.role, err, tt.wantSD)
		}
	}
	if init.resets != 1 {
		t.Errorf("init got %d resets, want 1 (admin)", init.resets)
	}
	if init.reboots != 2 || init.shutdowns != 2 || init.applies != 2 || init.rollbacks != 2 {
		t.Errorf("init got %d reboots, %d shutdowns, %d applies and %d rollbacks, want 2 each (operator and admin)", init.reboots, init.shutdowns, init.applies, init.rollbacks)
	}
}

// TestForeignCARefused proves that mutual TLS, not the role check, turns
// away a client the node's CA did not sign: the node's TLS handshake ends
// with the alert for the failure (unknown certificate authority, or
// certificate required when there is none), no method runs, and a client
// that does not trust the node's CA refuses the node with x509's
// UnknownAuthorityError.
func TestForeignCARefused(t *testing.T) {
	init := &recordingInit{}
	b, endpoint := serve(t, init, "")
	other, err := machineconfig.Generate(machineconfig.GenerateOptions{Hostname: "other", Endpoints: []string{endpoint}, Now: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	// Trusts the node, but presents a certificate the node's CA did not sign.
	foreign := *other.Client
	foreign.CA = b.Client.CA
	// Trusts the node, and presents no certificate at all.
	anonymous := *b.Client
	anonymous.Cert, anonymous.Key = "", ""

	for _, tt := range []struct {
		name      string
		cc        *machineconfig.ClientConfig
		wantAlert string
	}{
		{"certificate of another CA", &foreign, "remote error: tls: unknown certificate authority"},
		{"no certificate", &anonymous, "remote error: tls: certificate required"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := tlsprobe.HandshakeAndRead(tt.cc, endpoint, "h2")
			var op *net.OpError
			if err == nil || !errors.As(err, &op) || op.Op != "remote error" || err.Error() != tt.wantAlert {
				t.Errorf("TLS handshake and first read = %v, want the node's alert %q", err, tt.wantAlert)
			}
		})
	}

	// Through gRPC the refusal is Unavailable and reaches no method. (Its
	// text is the alert, or a broken pipe when the client's first write
	// races the node closing the connection, hence the check above.)
	c, err := client.Dial(&foreign, endpoint)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.Version(ctx, &machine.VersionRequest{}); status.Code(err) != codes.Unavailable {
		t.Errorf("Version() from a client of another CA = %v, want code Unavailable (TLS refused)", err)
	}
	if init.timelines.Load() != 0 {
		t.Errorf("Version ran %d times for refused clients, want 0", init.timelines.Load())
	}

	// The other way round: a client that trusts another CA refuses the
	// node's certificate itself.
	distrustful := *b.Client
	distrustful.CA = other.Client.CA
	err = tlsprobe.HandshakeAndRead(&distrustful, endpoint, "h2")
	if _, ok := errors.AsType[x509.UnknownAuthorityError](err); !ok {
		t.Errorf("handshake with a client that trusts another CA = %v, want x509.UnknownAuthorityError", err)
	}
}

// servicesInit answers Services with a service whose process is the test
// itself and one without a process.
type servicesInit struct{ machine.InitClient }

func (servicesInit) Services(context.Context, *machine.ServicesRequest, ...grpc.CallOption) (*machine.ServicesResponse, error) {
	return &machine.ServicesResponse{Services: []*machine.ServiceStatus{
		{Name: "self", State: "Ready", Pid: int32(os.Getpid())},
		{Name: "down", State: "Backoff"},
	}}, nil
}

// TestServicesLimits reads each service's limits back from the cgroup its
// process is in; a service without a process has none.
func TestServicesLimits(t *testing.T) {
	root := need.CgroupV2(t)
	old := cgroupRoot
	cgroupRoot = root
	t.Cleanup(func() { cgroupRoot = old })
	raw, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	var own string
	for _, line := range strings.Split(string(raw), "\n") {
		if cg, ok := strings.CutPrefix(line, "0::"); ok {
			own = cg
		}
	}
	b, endpoint := serve(t, servicesInit{}, t.TempDir())
	c := clientWithRole(t, b, endpoint, machineconfig.RoleReader)
	resp, err := c.Services(context.Background(), &machine.ServicesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]*machine.ServiceStatus{}
	for _, s := range resp.Services {
		byName[s.Name] = s
	}
	if l := byName["self"].GetLimits(); l.GetCgroup() != own {
		t.Errorf("Services() limits of self = %v, want those of cgroup %s", l, own)
	}
	for _, f := range []struct{ name, got string }{
		{"memory.max", byName["self"].GetLimits().GetMemoryMax()},
		{"pids.max", byName["self"].GetLimits().GetPidsMax()},
	} {
		want, err := os.ReadFile(filepath.Join(root, own, f.name))
		if err != nil {
			want = nil // no such controller here: nothing to read
		}
		if f.got != strings.TrimSpace(string(want)) {
			t.Errorf("Services() %s of self = %q, want %q", f.name, f.got, strings.TrimSpace(string(want)))
		}
	}
	if l := byName["down"].GetLimits(); l != nil {
		t.Errorf("Services() limits of a service without a process = %v, want none", l)
	}
}
