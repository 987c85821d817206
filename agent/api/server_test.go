package api

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/cairn-os/cairn/api/client"
	"github.com/cairn-os/cairn/api/machine"
	"github.com/cairn-os/cairn/machineconfig"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// recordingInit stands in for init's control socket, which only PID 1
// serves: it records what the agent forwards.
type recordingInit struct {
	machine.InitClient
	reboots, shutdowns int
}

func (r *recordingInit) BootTimeline(context.Context, *machine.BootTimelineRequest, ...grpc.CallOption) (*machine.BootTimelineResponse, error) {
	return &machine.BootTimelineResponse{Steps: []*machine.BootStep{{Name: "mount STATE"}}}, nil
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
	srv, err := NewServer(b.Config, init, podLogRoot)
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
	}{
		{machineconfig.RoleReader, codes.OK, codes.PermissionDenied, codes.PermissionDenied},
		{machineconfig.RoleOperator, codes.OK, codes.OK, codes.OK},
		{machineconfig.RoleAdmin, codes.OK, codes.OK, codes.OK},
	}
	for _, tt := range tests {
		c := clientWithRole(t, b, endpoint, tt.role)
		v, err := c.Version(ctx, &machine.VersionRequest{})
		if status.Code(err) != tt.wantVersion {
			t.Errorf("%s: Version() = %v, want %v", tt.role, err, tt.wantVersion)
		}
		if err == nil && (len(v.BootTimeline) != 1 || v.Kernel == "") {
			t.Errorf("%s: Version() = %v, want the kernel and init's boot timeline", tt.role, v)
		}
		if _, err := c.Reboot(ctx, &machine.RebootRequest{}); status.Code(err) != tt.wantReboot {
			t.Errorf("%s: Reboot() = %v, want %v", tt.role, err, tt.wantReboot)
		}
		if _, err := c.Shutdown(ctx, &machine.ShutdownRequest{}); status.Code(err) != tt.wantSD {
			t.Errorf("%s: Shutdown() = %v, want %v", tt.role, err, tt.wantSD)
		}
	}
	if init.reboots != 2 || init.shutdowns != 2 {
		t.Errorf("init got %d reboots and %d shutdowns, want 2 each (operator and admin)", init.reboots, init.shutdowns)
	}
}

func TestForeignCARefused(t *testing.T) {
	b, endpoint := serve(t, &recordingInit{}, "")
	other, err := machineconfig.Generate(machineconfig.GenerateOptions{Hostname: "other", Endpoints: []string{endpoint}, Now: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	// Trust the node, but present a certificate the node's CA did not sign.
	cc := *other.Client
	cc.CA = b.Client.CA
	c, err := client.Dial(&cc, endpoint)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.Version(ctx, &machine.VersionRequest{}); err == nil {
		t.Error("Version() from a client of another CA succeeded, want it refused")
	}
}
