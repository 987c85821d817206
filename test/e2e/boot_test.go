//go:build e2e

package e2e

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

	"github.com/cairn-os/cairn/api/client"
	"github.com/cairn-os/cairn/api/machine"
	"github.com/cairn-os/cairn/machineconfig"
	"github.com/cairn-os/cairn/qemu"
	"github.com/cairn-os/cairn/test/kube"
	"github.com/cairn-os/cairn/test/registry"
)

// unmatchedMAC selects no link of the VM: the config asks for an interface
// the node does not have.
const unmatchedMAC = "02:00:00:00:00:99"

// podNetwork is the cluster's pod network: kube-controller-manager gives
// the node a range of it.
const podNetwork = "10.244.0.0/16"

// TestBoot builds an image with a non-default hostname and a static
// address, boots it, and checks the node through its API only. The config
// also names an interface the VM lacks: the node must boot anyway, report
// it, and serve the API on the address it has. It declares two system
// services: one whose image the guest pulls from a registry on the host,
// one whose registry is unreachable. The node joins a control plane on the
// host and runs a Pod (see testPod).
func TestBoot(t *testing.T) {
	dir := t.TempDir()
	port := freePort(t)
	endpoint := fmt.Sprintf("127.0.0.1:%d", port)
	reg := registry.Start(t)
	if _, err := registry.BuildAndPush(context.Background(), reg, "./test/images/hello", "cairn-test/hello:v1"); err != nil {
		t.Fatal(err)
	}
	guestRegistry := fmt.Sprintf("%s:%d", guestHost, reg.Port())
	kc := kube.Start(t, kube.Options{PodCIDR: podNetwork, ServingIPs: []net.IP{net.ParseIP(guestHost)}})
	cairn(t, "config", "gen", "--out", dir, "--hostname", "e2e-node", "--interface", "eth0",
		"--address", "10.0.2.15/24", "--gateway", "10.0.2.2", "--nameserver", "10.0.2.3",
		"--endpoint", endpoint)
	editConfig(t, filepath.Join(dir, "machine.yaml"), func(cfg *machineconfig.Config) {
		cfg.Network.Interfaces = append(cfg.Network.Interfaces, machineconfig.Interface{MAC: unmatchedMAC, Addresses: []string{"192.0.2.10/24"}})
		cfg.Containerd.Registries = []machineconfig.Registry{{Host: guestRegistry, Endpoints: []string{"http://" + guestRegistry}}}
		cfg.Services = []machineconfig.Service{
			{Name: "hello", Image: guestRegistry + "/cairn-test/hello:v1", Args: []string{"--from-config"}},
			{Name: "unreachable", Image: "10.0.2.2:1/cairn-test/none:v1"},
		}
		cfg.Cluster = &machineconfig.Cluster{
			Server: guestURL(kc.URL), CA: string(kc.CAPEM), BootstrapToken: kc.BootstrapToken,
			ClusterCIDRs: []string{podNetwork},
		}
	})
	cairn(t, "image", "build", "-c", filepath.Join(dir, "machine.yaml"), "-o", filepath.Join(dir, "node.raw"), "--assets", binDir)

	c, cc := dialNode(t, dir, endpoint)

	metricsPort := freePort(t)
	vm, err := qemu.Start(qemu.Options{Disk: filepath.Join(dir, "node.raw"), APIPort: port, MetricsPort: metricsPort})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		select {
		case <-vm.Done():
		default:
			vm.Kill()
		}
		if t.Failed() {
			log, _ := os.ReadFile(vm.Opts.ConsoleLog)
			t.Logf("console log:\n%s", log)
		}
	})
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if err := vm.WaitReady(ctx, func(ctx context.Context) error {
		_, err := c.Version(ctx, &machine.VersionRequest{})
		return err
	}, nil); err != nil {
		t.Fatal(err)
	}
	t.Logf("API ready %s after QEMU started (accel %s)", time.Since(start).Round(time.Second), vm.Accel)
	ready := func(ctx context.Context) error {
		// While the node reboots, QEMU still accepts connections on the
		// forwarded port: bound every call.
		ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		_, err := c.Version(ctx, &machine.VersionRequest{})
		return err
	}

	v, err := c.Version(ctx, &machine.VersionRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if v.Hostname != "e2e-node" {
		t.Errorf("Version().Hostname = %q, want e2e-node", v.Hostname)
	}
	if !slices.Contains(v.Addresses, "10.0.2.15/24") {
		t.Errorf("Version().Addresses = %v, want 10.0.2.15/24 among them", v.Addresses)
	}
	if !strings.HasPrefix(v.Kernel, "6.1.") {
		t.Errorf("Version().Kernel = %q, want the pinned Debian 6.1 kernel", v.Kernel)
	}
	checkTimeline(t, v.BootTimeline)

	t.Run("CLI", func(t *testing.T) {
		out := cairn(t, "node", "--cairnconfig", filepath.Join(dir, "cairnconfig"), "version")
		if !strings.Contains(out, "e2e-node") || !strings.Contains(out, "mount STATE") {
			t.Errorf("cairn node version printed:\n%s\nwant the hostname and the boot timeline", out)
		}
		out = cairn(t, "node", "--cairnconfig", filepath.Join(dir, "cairnconfig"), "services")
		for _, want := range []string{"SERVICE", "containerd", "cairn-agent", "hello", "unreachable"} {
			if !strings.Contains(out, want) {
				t.Errorf("cairn node services printed:\n%s\nwant %q in it", out, want)
			}
		}
	})

	t.Run("ForeignCARefused", func(t *testing.T) {
		other, err := machineconfig.Generate(machineconfig.GenerateOptions{Hostname: "other", Endpoints: []string{endpoint}, Now: time.Now()})
		if err != nil {
			t.Fatal(err)
		}
		// Trust the node, but present a certificate its CA did not sign.
		foreign := *other.Client
		foreign.CA = cc.CA
		oc, err := client.Dial(&foreign, endpoint)
		if err != nil {
			t.Fatal(err)
		}
		defer oc.Close()
		cctx, ccancel := context.WithTimeout(ctx, 20*time.Second)
		defer ccancel()
		if _, err := oc.Version(cctx, &machine.VersionRequest{}); err == nil {
			t.Error("Version with a client certificate from another CA succeeded, want it refused")
		} else {
			t.Logf("refused as expected: %v", err)
		}
	})

	t.Run("Pod", func(t *testing.T) {
		testPod(t, ctx, kc, c, filepath.Join(dir, "cairnconfig"), guestRegistry+"/cairn-test/hello:v1", metricsPort, start)
	})

	t.Run("Services", func(t *testing.T) { testServices(t, ctx, c) })

	t.Run("Reboot", func(t *testing.T) {
		if _, err := c.Reboot(ctx, &machine.RebootRequest{}); err != nil {
			t.Fatal(err)
		}
		// The API goes away, then the node comes back with a fresh uptime.
		for deadline := time.Now().Add(time.Minute); ready(ctx) == nil; time.Sleep(200 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("API still answering a minute after Reboot")
			}
		}
		if err := vm.WaitReady(ctx, ready, nil); err != nil {
			t.Fatal(err)
		}
		v2, err := c.Version(ctx, &machine.VersionRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if v2.Uptime.AsDuration() >= v.Uptime.AsDuration()+time.Since(start) || v2.Hostname != "e2e-node" {
			t.Errorf("after Reboot: uptime %s, hostname %q; want a fresh boot of e2e-node", v2.Uptime.AsDuration(), v2.Hostname)
		}
	})

	t.Run("Shutdown", func(t *testing.T) {
		if _, err := c.Shutdown(ctx, &machine.ShutdownRequest{}); err != nil {
			t.Fatal(err)
		}
		stopped := time.Now()
		select {
		case <-vm.Done():
			t.Logf("QEMU exited %s after Shutdown", time.Since(stopped).Round(100*time.Millisecond))
		case <-time.After(60 * time.Second):
			t.Fatal("QEMU still running 60s after Shutdown")
		}
		log, err := os.ReadFile(vm.Opts.ConsoleLog)
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"cairn: boot done", "cairn: shutting down then=power off", "cairn: bye then=power off"} {
			if !strings.Contains(string(log), want) {
				t.Errorf("console log lacks %q", want)
			}
		}
	})

	t.Run("GrowDisk", func(t *testing.T) {
		// The disk grows by 1 GiB while the node is off: at the next boot
		// EPHEMERAL grows into it, partition and filesystem.
		disk := filepath.Join(dir, "node.raw")
		st, err := os.Stat(disk)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(disk, st.Size()+1<<30); err != nil {
			t.Fatal(err)
		}
		vm, err := qemu.Start(qemu.Options{Disk: disk, APIPort: port})
		if err != nil {
			t.Fatal(err)
		}
		defer func() {
			select {
			case <-vm.Done():
			default:
				vm.Kill()
			}
		}()
		if err := vm.WaitReady(ctx, ready, nil); err != nil {
			t.Fatal(err)
		}
		v, err := c.Version(ctx, &machine.VersionRequest{})
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range v.BootTimeline {
			if s.Name == "prepare EPHEMERAL" && s.Error != "" {
				t.Errorf("prepare EPHEMERAL failed after the disk grew: %s", s.Error)
			}
		}
		log, _ := os.ReadFile(vm.Opts.ConsoleLog)
		if !strings.Contains(string(log), "EPHEMERAL partition grown") {
			t.Errorf("console log lacks %q:\n%s", "EPHEMERAL partition grown", log)
		}
		waitService(t, ctx, c, "containerd", "Ready on the grown EPHEMERAL", func(s map[string]*machine.ServiceStatus) bool {
			return s["containerd"].GetState() == "Ready"
		})
		if _, err := c.Shutdown(ctx, &machine.ShutdownRequest{}); err != nil {
			t.Fatal(err)
		}
		select {
		case <-vm.Done():
		case <-time.After(60 * time.Second):
			t.Fatal("QEMU still running 60s after Shutdown")
		}
	})
}

// editConfig changes the machine config at path.
func editConfig(t *testing.T, path string, edit func(*machineconfig.Config)) {
	t.Helper()
	cfg, err := machineconfig.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	edit(cfg)
	raw, err := cfg.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, raw, 0o600); err != nil {
		t.Fatal(err)
	}
}

// checkTimeline wants every boot step of both stages, in order, and no
// error but the one for the interface the VM lacks.
func checkTimeline(t *testing.T, steps []*machine.BootStep) {
	t.Helper()
	var names []string
	var last time.Duration
	for _, s := range steps {
		names = append(names, s.Name)
		if s.Start.AsDuration() < last {
			t.Errorf("boot step %q starts at %s, before the previous one (%s)", s.Name, s.Start.AsDuration(), last)
		}
		last = s.Start.AsDuration()
		switch {
		case s.Name == "configure network":
			if !strings.Contains(s.Error, "network.interfaces[1]") || !strings.Contains(s.Error, unmatchedMAC) {
				t.Errorf("configure network error = %q, want it to name network.interfaces[1] and %s", s.Error, unmatchedMAC)
			}
		case s.Error != "":
			t.Errorf("boot step %q failed: %s", s.Name, s.Error)
		}
		t.Logf("boot step %8.3fs %7.3fs %s", s.Start.AsDuration().Seconds(), s.Duration.AsDuration().Seconds(), s.Name)
	}
	for _, want := range []string{"mount root squashfs", "mount STATE", "load machine config", "configure network", "start services"} {
		if !slices.Contains(names, want) {
			t.Errorf("boot timeline %v lacks %q", names, want)
		}
	}
}
