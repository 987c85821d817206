package agent

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cairn-os/cairn/agent/cni"
	"github.com/cairn-os/cairn/agent/node"
	"github.com/cairn-os/cairn/agent/podroutes"
	"github.com/cairn-os/cairn/machineconfig"
	"github.com/cairn-os/cairn/test/kube"
	"github.com/cairn-os/cairn/test/need"
	"github.com/cairn-os/cairn/test/repo"
)

func TestProxyConfig(t *testing.T) {
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{corev1.LabelHostname: "n1-host"}},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
			{Type: corev1.NodeInternalIP, Address: "10.0.2.15"},
			{Type: corev1.NodeHostName, Address: "n1"},
			{Type: corev1.NodeInternalIP, Address: "fd00::15"},
		}},
	}
	cfg, err := proxyConfig(&machineconfig.Cluster{ClusterCIDRs: []string{"10.244.0.0/16", "fd00:244::/56"}}, node)
	if err != nil {
		t.Fatal(err)
	}
	wantIPs := []netip.Addr{netip.MustParseAddr("10.0.2.15"), netip.MustParseAddr("fd00::15")}
	wantCIDRs := []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:244::/56")}
	if cfg.NodeName != "n1" || cfg.Hostname != "n1-host" || !slices.Equal(cfg.NodeIPs, wantIPs) || !slices.Equal(cfg.ClusterCIDRs, wantCIDRs) {
		t.Errorf("proxyConfig() = %+v, want node n1, hostname n1-host, IPs %v, cluster CIDRs %v", cfg, wantIPs, wantCIDRs)
	}
}

// readyRuntime is a container runtime that is ready, as far as the
// Node's status tells.
type readyRuntime struct{}

func (readyRuntime) RuntimeVersion(context.Context) (string, error) { return "containerd://test", nil }
func (readyRuntime) RuntimeStatus(context.Context) (bool, bool, string, error) {
	return true, true, "", nil
}

// TestWritePodNetwork joins a node that registers without a pod range to
// a real control plane whose node IPAM gives it one soon after: the pod
// network writer, watching the Node, writes the network with that range
// and is done.
func TestWritePodNetwork(t *testing.T) {
	root, err := repo.Root()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(root, "_out", "bin", "cni")
	if dir := os.Getenv("CAIRN_BIN"); dir != "" {
		bin = filepath.Join(dir, "cni")
	}
	for _, p := range []string{"bridge", "host-local", "portmap", "loopback"} {
		need.Built(t, filepath.Join(bin, p), "components", "CAIRN_BIN")
	}
	c := kube.Start(t, kube.Options{PodCIDR: "10.244.0.0/16"})
	paths := nodePaths{cniBinDir: bin, cniConfDir: t.TempDir()}
	written := make(chan error, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// The pods' MTU is the Node's links' less VXLAN's overhead, since other
	// nodes may be reached through the tunnel.
	routes, err := podroutes.New(podroutes.Config{NodeName: "cni-1", Mode: machineconfig.PodNetworkVXLAN})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		done <- node.Run(ctx, node.Config{
			NodeName: "cni-1",
			Cluster: machineconfig.Cluster{Server: c.URL, CA: string(c.CAPEM), BootstrapToken: c.BootstrapToken,
				ClusterDomain: machineconfig.DefaultClusterDomain},
			Dir: t.TempDir(), RuntimeInfo: readyRuntime{}, RuntimeStatus: readyRuntime{}, Version: "test",
			Log: slog.New(slog.NewTextHandler(testWriter{t}, nil)),
		}, []node.Component{{Name: "cni", Run: func(ctx context.Context, m *node.Member) error {
			err := writePodNetwork(ctx, m, paths, routes.PodMTU)
			written <- err
			return err
		}}})
	}()
	select {
	case err := <-written:
		if err != nil {
			t.Fatalf("writePodNetwork() = %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("pod network not written within 60 s")
	}
	n, err := c.Client.CoreV1().Nodes().Get(context.Background(), "cni-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	conf, err := os.ReadFile(filepath.Join(paths.cniConfDir, cni.FileName))
	if err != nil {
		t.Fatal(err)
	}
	if len(n.Spec.PodCIDRs) != 1 || !strings.Contains(string(conf), `"`+n.Spec.PodCIDRs[0]+`"`) {
		t.Errorf("pod network written:\n%s\nwant the Node's pod CIDRs %v", conf, n.Spec.PodCIDRs)
	}
	if want := fmt.Sprintf(`"mtu": %d`, tunnelMTU(t, n)); !strings.Contains(string(conf), want) {
		t.Errorf("pod network written:\n%s\nwant %s", conf, want)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("node.Run() = %v", err)
	}
}

// tunnelMTU returns the least MTU of the interfaces that hold n's
// InternalIPs, less VXLAN's overhead over each one's family: 50 bytes over
// IPv4, 70 over IPv6.
func tunnelMTU(t *testing.T, n *corev1.Node) int {
	t.Helper()
	ifaces, err := net.Interfaces()
	if err != nil {
		t.Fatal(err)
	}
	least := 0
	for _, a := range n.Status.Addresses {
		if a.Type != corev1.NodeInternalIP {
			continue
		}
		for _, i := range ifaces {
			addrs, _ := i.Addrs()
			for _, ia := range addrs {
				ipn, ok := ia.(*net.IPNet)
				if !ok || ipn.IP.String() != a.Address {
					continue
				}
				m := i.MTU - 50
				if ipn.IP.To4() == nil {
					m = i.MTU - 70
				}
				if least == 0 || m < least {
					least = m
				}
			}
		}
	}
	if least == 0 {
		t.Fatalf("no interface holds an InternalIP of %v", n.Status.Addresses)
	}
	return least
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

func TestEvictionThresholds(t *testing.T) {
	got := evictionThresholds(machineconfig.Eviction{Hard: map[string]string{"memory.available": "1Gi", "imagefs.available": "20%"}}).WithDefaults()
	want := node.DefaultThresholds
	want.MemoryAvailable, want.ImagefsAvailable = 1<<30, 20
	if got != want {
		t.Errorf("thresholds %+v, want %+v", got, want)
	}
	soft := softEviction(machineconfig.Eviction{Soft: map[string]string{"nodefs.available": "20%"}, SoftGracePeriod: map[string]string{"nodefs.available": "2m"}})
	if soft.Thresholds != (node.Thresholds{NodefsAvailable: 20}) || soft.GracePeriods["nodefs.available"] != 2*time.Minute || soft.MaxPodGracePeriod != 30*time.Second {
		t.Errorf("soft eviction %+v, want nodefs.available 20%% for 2m, pods 30s at most", soft)
	}
}
