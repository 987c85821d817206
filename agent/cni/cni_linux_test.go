package cni

import (
	"context"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cairn-os/cairn/test/nsrun"

	"github.com/cairn-os/cairn/test/need"

	"github.com/containernetworking/cni/libcni"
	types100 "github.com/containernetworking/cni/pkg/types/100"

	"github.com/cairn-os/cairn/test/repo"
)

// pluginDir returns the CNI plugins that `make components` built, or
// skips the test (see package need).
func pluginDir(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("CAIRN_BIN")
	if dir == "" {
		root, err := repo.Root()
		if err != nil {
			t.Fatal(err)
		}
		dir = filepath.Join(root, "_out", "bin")
	}
	dir = filepath.Join(dir, "cni")
	for _, p := range []string{"bridge", "host-local", "portmap", "loopback"} {
		need.Built(t, filepath.Join(dir, p), "components", "CAIRN_BIN")
	}
	return dir
}

// TestPodNetwork writes the configuration, then runs it with the real
// plugins as containerd's CRI would, for a pod with a hostPort: the node
// is a network namespace of its own, so is the pod. The node reaches the
// pod at its address and through the hostPort.
func TestPodNetwork(t *testing.T) {
	need.Root(t, "network namespaces")
	need.Tool(t, "ip", "iproute2")
	bin := pluginDir(t)
	need.Tool(t, "nft", "nftables") // portmap's nftables backend
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := t.TempDir()
	podCIDR := netip.MustParsePrefix("10.244.7.0/24")
	// An MTU below the node's, as for a pod network tunnelled to other
	// nodes: the pod's link must have it.
	n := Network{PodCIDRs: []netip.Prefix{podCIDR}, BinDir: bin, ConfDir: filepath.Join(dir, "net.d"), DataDir: filepath.Join(dir, "networks"), MTU: 1400}

	if _, err := Write(ctx, Network{PodCIDRs: n.PodCIDRs, BinDir: t.TempDir(), ConfDir: n.ConfDir}); err == nil || !strings.Contains(err.Error(), "bridge") {
		t.Errorf("Write with no plugins = %v, want an error naming the bridge plugin", err)
	}
	if ents, _ := os.ReadDir(n.ConfDir); len(ents) != 0 {
		t.Errorf("Write with no plugins left %v in %s", ents, n.ConfDir)
	}
	path, err := Write(ctx, n)
	if err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(n.ConfDir); len(ents) != 1 || ents[0].Name() != FileName {
		t.Errorf("%s holds %v, want %s only", n.ConfDir, ents, FileName)
	}
	list, err := libcni.ConfListFromFile(path)
	if err != nil {
		t.Fatal(err)
	}

	_, node := nsrun.New(t, "node")
	podName, pod := nsrun.New(t, "pod")
	podPath := "/run/netns/" + podName
	plugins := libcni.NewCNIConfigWithCacheDir([]string{bin}, filepath.Join(dir, "cache"), nil)
	rt := &libcni.RuntimeConf{
		ContainerID: "cairn-cni-test", NetNS: podPath, IfName: "eth0",
		CapabilityArgs: map[string]any{"portMappings": []map[string]any{{"hostPort": 18080, "containerPort": 80, "protocol": "tcp"}}},
	}
	var res *types100.Result
	nsrun.In(t, node, func() {
		r, err := plugins.AddNetworkList(ctx, list, rt)
		if err != nil {
			t.Fatalf("ADD: %v", err)
		}
		if res, err = types100.NewResultFromResult(r); err != nil {
			t.Fatal(err)
		}
	})
	if len(res.IPs) != 1 {
		t.Fatalf("ADD gave addresses %v, want one", res.IPs)
	}
	podIP, _ := netip.AddrFromSlice(res.IPs[0].Address.IP.To4())
	gw, _ := netip.AddrFromSlice(res.IPs[0].Gateway.To4())
	if !podCIDR.Contains(podIP) || gw != podCIDR.Addr().Next() {
		t.Errorf("pod address %s via %s, want one in %s via its first address", podIP, gw, podCIDR)
	}

	// A server in the pod, reached from the node.
	var l net.Listener
	nsrun.In(t, pod, func() {
		if eth0, err := net.InterfaceByName("eth0"); err != nil || eth0.MTU != n.MTU {
			t.Errorf("the pod's eth0: %+v, %v; want MTU %d", eth0, err, n.MTU)
		}
		if l, err = net.Listen("tcp", ":80"); err != nil {
			t.Fatal(err)
		}
	})
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			io.WriteString(c, "from the pod\n")
			c.Close()
		}
	}()
	for _, addr := range []string{netip.AddrPortFrom(podIP, 80).String(), netip.AddrPortFrom(gw, 18080).String()} {
		nsrun.In(t, node, func() {
			c, err := net.DialTimeout("tcp", addr, 5*time.Second)
			if err != nil {
				t.Errorf("dial %s from the node: %v", addr, err)
				return
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(5 * time.Second))
			if got, err := io.ReadAll(c); err != nil || string(got) != "from the pod\n" {
				t.Errorf("read from %s = %q, %v; want the pod's greeting", addr, got, err)
			}
		})
	}

	nsrun.In(t, node, func() {
		if err := plugins.DelNetworkList(ctx, list, rt); err != nil {
			t.Errorf("DEL: %v", err)
		}
		out, _ := exec.Command("nft", "list", "ruleset").CombinedOutput()
		if strings.Contains(string(out), "18080") {
			t.Errorf("the hostPort is still mapped after DEL:\n%s", out)
		}
	})
	if _, err := os.Stat(filepath.Join(n.DataDir, NetworkName, podIP.String())); !os.IsNotExist(err) {
		t.Errorf("host-local still records %s after DEL (stat: %v)", podIP, err)
	}
}
