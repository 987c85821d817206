//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
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
	"github.com/cairn-os/cairn/test/tlsprobe"
	"github.com/diskfs/go-diskfs/partition/gpt"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// unmatchedMAC selects no link of the VM: the config asks for an interface
// the node does not have.
const unmatchedMAC = "02:00:00:00:00:99"

// The VM's second NIC (qemu.Options.IsolatedNIC) is on a network where
// nothing answers: DHCP on it times out. The config also gives it a static
// address, which it gets at once.
const (
	isolatedLink    = "eth1"
	isolatedAddress = "192.168.77.10/24"
	// dhcpAddress is what QEMU's user network leases to the first NIC.
	dhcpAddress = "10.0.2.15/24"
)

// podNetwork is the cluster's pod network: kube-controller-manager gives
// the node a range of it.
const podNetwork = "10.244.0.0/16"

// TestBoot builds an image whose config `cairn config gen` made without
// addresses (DHCP on eth0) with a non-default hostname, boots it, and
// checks the node through its API only. The config also names an interface
// the VM lacks, and asks for DHCP on a second NIC where nothing answers:
// the node must boot anyway without waiting for that lease, report both,
// and serve the API on the addresses it has. It declares two system
// services, with cgroup limits for them, containerd and the agent: one
// whose image the guest pulls from a registry on the host, one whose
// registry is unreachable. The node joins a control plane on the host and
// runs a Pod (see testPod). Its config is changed live, tried and staged
// through the API (see testApplyConfig), and the reboot takes the staged
// one. Later boots of the same disk grow EPHEMERAL, then find it damaged.
func TestBoot(t *testing.T) {
	dir := t.TempDir()
	port := freePort(t)
	endpoint := fmt.Sprintf("127.0.0.1:%d", port)
	reg := registry.Start(t)
	for _, img := range []struct{ pkg, tag string }{
		{"./test/images/hello", "cairn-test/hello:v1"},
		{"./agent/kubelet/testdata/probee", "cairn-test/probee:v1"},
	} {
		if _, err := registry.BuildAndPush(context.Background(), reg, img.pkg, img.tag); err != nil {
			t.Fatal(err)
		}
	}
	guestRegistry := fmt.Sprintf("%s:%d", guestHost, reg.Port())
	// The scheduler places the CSI driver's DaemonSet pod (testCSI).
	kc := kube.Start(t, kube.Options{PodCIDR: podNetwork, ServingIPs: []net.IP{net.ParseIP(guestHost)}, Scheduler: true})
	cairn(t, "config", "gen", "--out", dir, "--hostname", "e2e-node", "--interface", "eth0", "--endpoint", endpoint)
	config := filepath.Join(dir, "machine.yaml")
	editConfig(t, config, func(cfg *machineconfig.Config) {
		if ic := cfg.Network.Interfaces; len(ic) != 1 || !ic[0].DHCP || len(ic[0].Addresses) != 0 {
			t.Fatalf("cairn config gen without --address wrote interfaces %+v, want DHCP alone", ic)
		}
		cfg.Network.Interfaces = append(cfg.Network.Interfaces,
			machineconfig.Interface{MAC: unmatchedMAC, Addresses: []string{"192.0.2.10/24"}},
			machineconfig.Interface{Name: isolatedLink, DHCP: true, Addresses: []string{isolatedAddress}},
		)
		// The kernel's warnings too (9 lines a boot), for the register
		// dump and stack of a soft lockup: one was seen once under TCG
		// (both vCPUs stuck in init's threads) and never again.
		cfg.Machine.Kernel.Args = []string{"loglevel=5"}
		cfg.Machine.Resources = machineconfig.MachineResources{
			Containerd: machineconfig.Resources{MemoryMax: "1Gi", CPUWeight: 200, PidsMax: 4096},
			Agent:      machineconfig.Resources{MemoryMax: "768Mi", CPUMax: "1500m"},
		}
		cfg.Containerd.Registries = []machineconfig.Registry{{Host: guestRegistry, Endpoints: []string{"http://" + guestRegistry}}}
		cfg.Services = []machineconfig.Service{
			{
				Name: "hello", Image: guestRegistry + "/cairn-test/hello:v1", Args: []string{"--from-config"},
				Resources: machineconfig.Resources{MemoryMax: "64Mi", CPUMax: "250m", CPUWeight: 50, PidsMax: 64},
			},
			{Name: "unreachable", Image: "10.0.2.2:1/cairn-test/none:v1"},
		}
		cfg.Cluster = &machineconfig.Cluster{
			Server: guestURL(kc.URL), CA: string(kc.CAPEM), BootstrapToken: kc.BootstrapToken,
			ClusterCIDRs: []string{podNetwork},
		}
	})
	cfg, err := machineconfig.Load(config)
	if err != nil {
		t.Fatal(err)
	}
	cairn(t, "image", "build", "-c", config, "-o", filepath.Join(dir, "node.raw"), "--assets", binDir)

	c, cc := dialNode(t, dir, endpoint)

	metricsPort := freePort(t)
	vm := bootVM(t, qemu.Options{Disk: filepath.Join(dir, "node.raw"), APIPort: port, MetricsPort: metricsPort, IsolatedNIC: true})
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	if err := vm.WaitReady(ctx, "the API", func(ctx context.Context) error {
		_, err := c.Version(ctx, &machine.VersionRequest{})
		return err
	}, nil); err != nil {
		t.Fatal(err)
	}
	t.Logf("API ready %s after QEMU started (accel %s)", time.Since(start).Round(time.Second), vm.Accel())
	ready := apiReady(c)

	v, err := c.Version(ctx, &machine.VersionRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if v.Hostname != "e2e-node" {
		t.Errorf("Version().Hostname = %q, want e2e-node", v.Hostname)
	}
	if !strings.HasPrefix(v.Kernel, "6.1.") {
		t.Errorf("Version().Kernel = %q, want the pinned Debian 6.1 kernel", v.Kernel)
	}

	t.Run("DHCPLease", func(t *testing.T) {
		// The boot waits a few seconds for leases, then goes on: the lease
		// may come after the API.
		v := waitVersion(t, ctx, c, "DHCP on eth0 in the boot timeline", func(v *machine.VersionResponse) bool {
			return step(v.BootTimeline, "DHCP on eth0") != nil
		})
		if s := step(v.BootTimeline, "DHCP on eth0"); s.Error != "" {
			t.Errorf("DHCP on eth0 failed: %s", s.Error)
		}
		if !slices.Contains(v.Addresses, dhcpAddress) {
			t.Errorf("Version().Addresses = %v, want the lease %s among them", v.Addresses, dhcpAddress)
		}
		if !slices.Contains(v.Addresses, isolatedAddress) {
			t.Errorf("Version().Addresses = %v, want %s, the static address of %s, among them", v.Addresses, isolatedAddress, isolatedLink)
		}
	})

	t.Run("DHCPTimeoutDoesNotBlockBoot", func(t *testing.T) {
		v := waitVersion(t, ctx, c, "DHCP on "+isolatedLink+" in the boot timeline", func(v *machine.VersionResponse) bool {
			return step(v.BootTimeline, "DHCP on "+isolatedLink) != nil
		})
		d := step(v.BootTimeline, "DHCP on "+isolatedLink)
		if !strings.Contains(d.Error, "network.interfaces[2]") || !strings.Contains(d.Error, "DHCP on "+isolatedLink+": no lease") {
			t.Errorf("DHCP on %s error = %q, want no lease on %s reported for network.interfaces[2]", isolatedLink, d.Error, isolatedLink)
		}
		dhcpEnd := d.Start.AsDuration() + d.Duration.AsDuration()
		network, services := step(v.BootTimeline, "configure network"), step(v.BootTimeline, "start services")
		if network == nil || services == nil {
			t.Fatalf("boot timeline lacks configure network or start services: %v", v.BootTimeline)
		}
		if took := network.Duration.AsDuration(); took > 10*time.Second {
			t.Errorf("configure network took %s, want the DHCP timeout (%s) not waited for", took, d.Duration.AsDuration())
		}
		if services.Start.AsDuration() >= dhcpEnd {
			t.Errorf("start services at %s, after the DHCP on %s gave up (%s): the boot waited for it", services.Start.AsDuration(), isolatedLink, dhcpEnd)
		}
		t.Logf("DHCP on %s gave up after %s; services started at %s", isolatedLink, d.Duration.AsDuration().Round(time.Millisecond), services.Start.AsDuration().Round(time.Millisecond))
		checkTimeline(t, v.BootTimeline)
	})

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
		// Checks from the node: to its own loopback, and to the test's
		// registry on the host through QEMU's gateway.
		for _, c := range []struct {
			args []string
			want string // a regular expression
		}{
			{[]string{"ping", "-c", "2", "-i", "200ms", "127.0.0.1"}, "2 sent, 2 received"},
			{[]string{"lookup", "localhost"}, "localhost: 127.0.0.1"},
			{[]string{"connect", guestRegistry}, "connected to " + regexp.QuoteMeta(guestRegistry) + " from 10.0.2.15:"},
			{[]string{"network"}, `tcp6?\s+LISTEN\s+\S+:50000\s+\S+\s+\d+\s+cairn-agent`},
		} {
			out := cairn(t, append([]string{"node", "--cairnconfig", filepath.Join(dir, "cairnconfig")}, c.args...)...)
			if !regexp.MustCompile(c.want).MatchString(out) {
				t.Errorf("cairn node %s printed:\n%s\nwant it to match %q", strings.Join(c.args, " "), out, c.want)
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
		if _, err := oc.Version(cctx, &machine.VersionRequest{}); status.Code(err) != codes.Unavailable {
			t.Errorf("Version with a client certificate from another CA: %v, want it refused (Unavailable)", err)
		}
		// The refusal is the node's TLS server rejecting the certificate's
		// issuer, not any error on the way (gRPC often reports the alert
		// as a broken pipe: read it directly).
		if err := tlsprobe.HandshakeAndRead(&foreign, endpoint, "h2"); err == nil || !strings.Contains(err.Error(), "tls: unknown certificate authority") {
			t.Errorf("TLS with a client certificate from another CA: %v, want the node's unknown certificate authority alert", err)
		}
	})

	t.Run("Pod", func(t *testing.T) {
		testPod(t, ctx, kc, c, filepath.Join(dir, "cairnconfig"), guestRegistry+"/cairn-test/hello:v1", metricsPort, start)
	})

	t.Run("NetworkPolicy", func(t *testing.T) {
		testNetworkPolicy(t, ctx, kc, c, guestRegistry+"/cairn-test/hello:v1")
	})

	t.Run("CSI", func(t *testing.T) { testCSI(t, kc, c, reg, guestRegistry) })

	t.Run("Services", func(t *testing.T) { testServices(t, ctx, c, cfg) })

	t.Run("ApplyConfig", func(t *testing.T) {
		testApplyConfig(t, ctx, c, kc, config, filepath.Join(dir, "cairnconfig"), "e2e-node")
	})

	t.Run("Reboot", func(t *testing.T) {
		prestop := startPreStopPod(t, ctx, kc, guestRegistry+"/cairn-test/probee:v1")
		asked := time.Now()
		if _, err := c.Reboot(ctx, &machine.RebootRequest{}); err != nil {
			t.Fatal(err)
		}
		// The API goes away, then the node comes back with a fresh uptime.
		away := awayAndBack(t, ctx, vm, ready, "Reboot")
		v2, err := c.Version(ctx, &machine.VersionRequest{})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("API away %s after Reboot, back %s later, at guest uptime %s",
			away.Sub(asked).Round(100*time.Millisecond), time.Since(away).Round(100*time.Millisecond), v2.Uptime.AsDuration().Round(100*time.Millisecond))
		if v2.Uptime.AsDuration() >= v.Uptime.AsDuration()+time.Since(start) || v2.Hostname != "e2e-node" {
			t.Errorf("after Reboot: uptime %s, hostname %q; want a fresh boot of e2e-node", v2.Uptime.AsDuration(), v2.Hostname)
		}
		prestop.check(t, ctx, c)
	})

	t.Run("StagedAfterReboot", func(t *testing.T) { testStagedAfterReboot(t, ctx, c) })

	t.Run("UpgradeAndRollback", func(t *testing.T) {
		upgradeCycle(t, ctx, c, filepath.Join(dir, "cairnconfig"), config, kc.Client, "e2e-node", reg)
	})

	t.Run("Reset", func(t *testing.T) {
		testReset(t, ctx, c, vm, ready, filepath.Join(dir, "cairnconfig"), roleConfig(t, dir, machineconfig.RoleOperator), v)
	})

	t.Run("Shutdown", func(t *testing.T) {
		if _, err := c.Shutdown(ctx, &machine.ShutdownRequest{}); err != nil {
			t.Fatal(err)
		}
		log := waitPoweredOff(t, vm, "Shutdown")
		for _, want := range []string{"cairn: boot done", "cairn: shutting down then=power off", "cairn: bye then=power off"} {
			if !strings.Contains(log, want) {
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
		vm := bootAgain(t, ctx, disk, port, ready)
		v, err := c.Version(ctx, &machine.VersionRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if s := step(v.BootTimeline, "prepare EPHEMERAL"); s == nil || s.Error != "" {
			t.Errorf("prepare EPHEMERAL after the disk grew = %v, want it done without error", s)
		}
		log, _ := os.ReadFile(vm.Opts.ConsoleLog)
		if !strings.Contains(string(log), "EPHEMERAL partition grown") {
			t.Errorf("console log lacks %q:\n%s", "EPHEMERAL partition grown", log)
		}
		waitService(t, ctx, c, "containerd", "Ready on the grown EPHEMERAL", func(s map[string]*machine.ServiceStatus) bool {
			return s["containerd"].GetState() == "Ready"
		})
		shutdown(t, ctx, c, vm)
	})

	t.Run("DamagedEphemeralReported", func(t *testing.T) {
		// EPHEMERAL's superblock is wiped while the node is off: e2fsck
		// cannot repair that on its own, so /var stays unmounted. The node
		// must still answer, and say why containerd cannot run.
		disk := filepath.Join(dir, "node.raw")
		wipeSuperblock(t, disk, "EPHEMERAL")
		vm := bootAgain(t, ctx, disk, port, ready)
		v, err := c.Version(ctx, &machine.VersionRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if s := step(v.BootTimeline, "prepare EPHEMERAL"); s == nil || !strings.Contains(s.Error, "EPHEMERAL") || !strings.Contains(s.Error, "damaged") {
			t.Errorf("prepare EPHEMERAL = %v, want it failed, saying EPHEMERAL is damaged", s)
		}
		st := waitService(t, ctx, c, "containerd", "in Backoff, and the agent Ready", func(s map[string]*machine.ServiceStatus) bool {
			return s["containerd"].GetState() == "Backoff" && s["cairn-agent"].GetState() == "Ready"
		})
		if r := st["containerd"].Reason; !strings.Contains(r, "EPHEMERAL is not mounted on /var") || !strings.Contains(r, "damaged") {
			t.Errorf("containerd's reason = %q, want it to say EPHEMERAL is damaged and not mounted on /var", r)
		}
		if s := st["hello"]; s.GetState() != "Waiting" || !strings.Contains(s.GetReason(), "containerd") {
			t.Errorf("hello = %s (%q), want Waiting for containerd", s.GetState(), s.GetReason())
		}
		shutdown(t, ctx, c, vm)
	})
}

// bootAgain boots the disk of TestBoot again and waits for the API.
// awayAndBack waits for the API to go away after what was asked of the
// node, then to come back; it returns when it went away.
func awayAndBack(t *testing.T, ctx context.Context, vm *qemu.VM, ready func(context.Context) error, after string) time.Time {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); ready(ctx) == nil; time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("API still answering a minute after %s", after)
		}
	}
	away := time.Now()
	if err := vm.WaitReady(ctx, "the API", ready, nil); err != nil {
		t.Fatal(err)
	}
	return away
}

func bootAgain(t *testing.T, ctx context.Context, disk string, port int, ready func(context.Context) error) *qemu.VM {
	t.Helper()
	vm := bootVM(t, qemu.Options{Disk: disk, APIPort: port, IsolatedNIC: true})
	start := time.Now()
	if err := vm.WaitReady(ctx, "the API", ready, nil); err != nil {
		t.Fatal(err)
	}
	t.Logf("API ready %s after QEMU started (accel %s)", time.Since(start).Round(time.Second), vm.Accel())
	return vm
}

// shutdown powers the node off through the API and waits for QEMU to exit.
func shutdown(t *testing.T, ctx context.Context, c *client.Client, vm *qemu.VM) {
	t.Helper()
	if _, err := c.Shutdown(ctx, &machine.ShutdownRequest{}); err != nil {
		t.Fatal(err)
	}
	waitPoweredOff(t, vm, "Shutdown")
}

// waitPoweredOff waits up to a minute for QEMU to exit after what was
// asked of the node, and returns the console log.
func waitPoweredOff(t *testing.T, vm *qemu.VM, after string) string {
	t.Helper()
	asked := time.Now()
	select {
	case <-vm.Done():
		t.Logf("QEMU exited %s after %s", time.Since(asked).Round(100*time.Millisecond), after)
	case <-time.After(60 * time.Second):
		t.Fatalf("QEMU still running 60s after %s", after)
	}
	log, err := os.ReadFile(vm.Opts.ConsoleLog)
	if err != nil {
		t.Fatal(err)
	}
	return string(log)
}

// wipeSuperblock zeroes the primary ext4 superblock (1 KiB at offset 1 KiB)
// of the partition labelled label on a raw disk image.
func wipeSuperblock(t *testing.T, disk, label string) {
	t.Helper()
	f, err := os.OpenFile(disk, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	table, err := gpt.Read(f, 512, 512)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range table.Partitions {
		if p.Name != label {
			continue
		}
		if _, err := f.WriteAt(make([]byte, 1024), int64(p.Start)*512+1024); err != nil {
			t.Fatal(err)
		}
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Fatalf("%s has no partition labelled %s", disk, label)
}

// step returns the boot step or record named name, nil if there is none.
func step(steps []*machine.BootStep, name string) *machine.BootStep {
	for _, s := range steps {
		if s.Name == name {
			return s
		}
	}
	return nil
}

// waitVersion polls Version for up to 2 minutes until cond holds.
func waitVersion(t *testing.T, ctx context.Context, c *client.Client, what string, cond func(*machine.VersionResponse) bool) *machine.VersionResponse {
	t.Helper()
	var v *machine.VersionResponse
	for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); time.Sleep(time.Second) {
		var err error
		if v, err = c.Version(ctx, &machine.VersionRequest{}); err != nil {
			t.Fatal(err)
		}
		if cond(v) {
			return v
		}
	}
	t.Fatalf("no %s after 2 minutes: %v", what, v)
	return nil
}

// editConfig changes the machine config at path.
func editConfig(t *testing.T, path string, edit func(*machineconfig.Config)) {
	t.Helper()
	if err := os.WriteFile(path, nodeConfigDoc(t, path, edit), 0o600); err != nil {
		t.Fatal(err)
	}
}

// checkTimeline wants every boot step of both stages, in order, and no
// error but those for the interface the VM lacks and the DHCP that gets no
// answer.
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
			if strings.Contains(s.Error, "network.interfaces[2]") {
				t.Errorf("configure network error = %q, want the DHCP on %s reported apart, not by the step", s.Error, isolatedLink)
			}
		case s.Name == "DHCP on "+isolatedLink:
		case s.Error != "":
			t.Errorf("boot step %q failed: %s", s.Name, s.Error)
		}
		t.Logf("boot step %8.3fs %7.3fs %s", s.Start.AsDuration().Seconds(), s.Duration.AsDuration().Seconds(), s.Name)
	}
	for _, want := range []string{"mount root squashfs", "mount STATE", "load machine config", "configure network", "DHCP on eth0", "DHCP on " + isolatedLink, "start services"} {
		if !slices.Contains(names, want) {
			t.Errorf("boot timeline %v lacks %q", names, want)
		}
	}
}
