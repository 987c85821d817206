package csi

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/cairn-os/cairn/test/poll"
)

// nodeServer is a driver's node service answering what registration asks.
type nodeServer struct {
	csipb.UnimplementedNodeServer
	id string
}

func (n *nodeServer) NodeGetInfo(context.Context, *csipb.NodeGetInfoRequest) (*csipb.NodeGetInfoResponse, error) {
	return &csipb.NodeGetInfoResponse{NodeId: n.id}, nil
}

func (n *nodeServer) NodeGetCapabilities(context.Context, *csipb.NodeGetCapabilitiesRequest) (*csipb.NodeGetCapabilitiesResponse, error) {
	return &csipb.NodeGetCapabilitiesResponse{}, nil
}

// registrar serves the registration of info, and tells what the node
// said of it on status.
type registrar struct {
	registerapi.UnimplementedRegistrationServer
	info   *registerapi.PluginInfo
	status chan *registerapi.RegistrationStatus
}

func (r *registrar) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	return r.info, nil
}

func (r *registrar) NotifyRegistrationStatus(_ context.Context, s *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	r.status <- s
	return &registerapi.RegistrationStatusResponse{}, nil
}

// serve serves register on a new socket at path until the test ends or
// the returned function stops it.
func serve(t *testing.T, path string, register func(*grpc.Server)) (stop func()) {
	t.Helper()
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	register(s)
	go s.Serve(l)
	t.Cleanup(s.Stop)
	return s.Stop
}

// TestRegistration runs the registry on a directory where registrars come
// and go: a CSI driver registers and is told so, one of another type or
// CSI version is refused and told why, a driver whose socket goes is
// forgotten and one that comes back is registered again.
func TestRegistration(t *testing.T) {
	dir := t.TempDir()
	p, err := New(Config{Dir: dir, NodeName: "n", rescan: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- p.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run() = %v", err)
		}
	}()
	endpoint := filepath.Join(dir, "driver.sock")
	serve(t, endpoint, func(s *grpc.Server) { csipb.RegisterNodeServer(s, &nodeServer{id: "node-id"}) })
	// The registry directory is made by Run.
	poll.Until(t, 10*time.Second, "the registry directory", func() error {
		_, err := os.Stat(p.RegistryDir())
		return err
	})

	register := func(name string, info *registerapi.PluginInfo) (*registrar, func()) {
		r := &registrar{info: info, status: make(chan *registerapi.RegistrationStatus, 10)}
		stop := serve(t, filepath.Join(p.RegistryDir(), name), func(s *grpc.Server) { registerapi.RegisterRegistrationServer(s, r) })
		return r, stop
	}
	status := func(r *registrar) *registerapi.RegistrationStatus {
		t.Helper()
		select {
		case s := <-r.status:
			return s
		case <-time.After(10 * time.Second):
			t.Fatal("the node never told the registrar")
			return nil
		}
	}

	good, stop := register("good-reg.sock", &registerapi.PluginInfo{Type: registerapi.CSIPlugin, Name: "good.csi", Endpoint: endpoint, SupportedVersions: []string{"1.0.0"}})
	if s := status(good); !s.PluginRegistered || s.Error != "" {
		t.Errorf("status %+v, want registered", s)
	}
	if got := p.Drivers(); !slices.Equal(got, []string{"good.csi"}) {
		t.Errorf("Drivers() = %v, want [good.csi]", got)
	}
	drivers, _ := p.csiNodeDrivers()
	if len(drivers) != 1 || drivers[0].NodeID != "node-id" {
		t.Errorf("CSINode drivers %+v, want good.csi on node-id", drivers)
	}

	for name, tc := range map[string]struct {
		info *registerapi.PluginInfo
		want string
	}{
		"device-reg.sock": {&registerapi.PluginInfo{Type: registerapi.DevicePlugin, Name: "gpu", Endpoint: endpoint, SupportedVersions: []string{"v1beta1"}},
			`type "DevicePlugin" is not CSIPlugin`},
		"old-reg.sock": {&registerapi.PluginInfo{Type: registerapi.CSIPlugin, Name: "old.csi", Endpoint: endpoint, SupportedVersions: []string{"0.3.0"}},
			"versions [0.3.0]: this node speaks CSI 1.x"},
		"gone-reg.sock": {&registerapi.PluginInfo{Type: registerapi.CSIPlugin, Name: "gone.csi", Endpoint: filepath.Join(dir, "nothing.sock"), SupportedVersions: []string{"1.0.0"}},
			"NodeGetInfo: "},
	} {
		r, _ := register(name, tc.info)
		s := status(r)
		if s.PluginRegistered || !strings.Contains(s.Error, tc.want) {
			t.Errorf("%s: status %+v, want refused with %q", name, s, tc.want)
		}
	}
	if got := p.Drivers(); !slices.Equal(got, []string{"good.csi"}) {
		t.Errorf("Drivers() after refusals = %v, want [good.csi]", got)
	}

	// The registrar goes, its socket with it: the driver is forgotten.
	stop()
	os.Remove(filepath.Join(p.RegistryDir(), "good-reg.sock"))
	poll.Until(t, 10*time.Second, "the driver forgotten", func() error {
		if got := p.Drivers(); len(got) > 0 {
			return fmt.Errorf("drivers %v", got)
		}
		return nil
	})
	if _, err := p.driver("good.csi"); err == nil || err.Error() != "driver name good.csi not found in the list of registered CSI drivers" {
		t.Errorf("driver(good.csi) = %v, want the kubelet's not found", err)
	}
	// It comes back: registered again.
	again, _ := register("good-reg.sock", good.info)
	if s := status(again); !s.PluginRegistered {
		t.Errorf("status %+v, want registered again", s)
	}
	if got := p.Drivers(); !slices.Equal(got, []string{"good.csi"}) {
		t.Errorf("Drivers() = %v, want [good.csi] again", got)
	}
}
