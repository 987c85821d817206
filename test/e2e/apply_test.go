//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cairn-os/cairn/api/client"
	"github.com/cairn-os/cairn/api/machine"
	"github.com/cairn-os/cairn/machineconfig"
	"github.com/cairn-os/cairn/test/kube"
	"github.com/cairn-os/cairn/test/poll"
)

// Values of vm.swappiness that the apply tests set, each told apart from
// the kernel's default (60).
const (
	swappinessLive   = "10"
	swappinessTried  = "20"
	swappinessStaged = "30"
)

// appliedFile is the machine file the live apply writes.
const appliedFile = "/etc/cairn-e2e/applied.conf"

// readNode reads a file on the node through the API, without the
// spaces around it.
func readNode(ctx context.Context, c *client.Client, path string) (string, error) {
	out, err := readStream(c.Read(ctx, &machine.ReadRequest{Path: path}))
	return strings.TrimSpace(out), err
}

// nodeConfigDoc is the machine config at path changed by edit, as YAML.
func nodeConfigDoc(t *testing.T, path string, edit func(*machineconfig.Config)) []byte {
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
	return raw
}

// liveAddress is a second address of the isolated link, applied live.
const liveAddress = "192.168.77.11/24"

// testApplyConfig changes the running node's config through the API, on
// the node booted from config (its first generation), which joined kc as
// nodeName: a dry run and an invalid config change nothing; a sysctl, a
// machine file and a Node label are applied live, seen without a reboot;
// a try is reverted when its timeout passes; a staged change is left for
// the next boot, which testStagedAfterReboot checks. It measures the
// live apply: the call until the change is in the kernel.
func testApplyConfig(t *testing.T, ctx context.Context, c *client.Client, kc *kube.Cluster, config, cairnconfig, nodeName string) {
	before, err := c.Version(ctx, &machine.VersionRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if g := before.Config.GetGeneration(); g != 1 || before.Config.BootGeneration != 1 {
		t.Fatalf("Version().Config = %v at the first boot, want generation 1 running and in STATE", before.Config)
	}
	swappiness := func() string {
		t.Helper()
		v, err := readNode(ctx, c, "/proc/sys/vm/swappiness")
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	bootSwappiness := swappiness()
	live := nodeConfigDoc(t, config, func(cfg *machineconfig.Config) {
		cfg.Machine.Sysctls = map[string]string{"vm.swappiness": swappinessLive}
		cfg.Machine.Files = []machineconfig.File{{Path: appliedFile, Content: "applied=live\n"}}
		cfg.Cluster.NodeLabels = map[string]string{"cairn.dev/applied": "live"}
		cfg.Machine.Resources.Agent.MemoryMax = "700Mi"
		cfg.Network.Interfaces[2].Addresses = append(cfg.Network.Interfaces[2].Addresses, liveAddress)
		// One image service goes, one comes; hello keeps running.
		cfg.Services = slices.DeleteFunc(cfg.Services, func(s machineconfig.Service) bool { return s.Name == "unreachable" })
		hello := cfg.Services[0]
		hello.Name, hello.Args = "hello-live", []string{"--from-apply"}
		cfg.Services = append(cfg.Services, hello)
	})
	liveFile := filepath.Join(t.TempDir(), "live.yaml")
	if err := os.WriteFile(liveFile, live, 0o600); err != nil {
		t.Fatal(err)
	}

	t.Run("DryRun", func(t *testing.T) {
		out := cairn(t, "node", "--cairnconfig", cairnconfig, "apply", "-f", liveFile, "--mode", "dry-run")
		for _, want := range []string{
			`live    machine.sysctls["vm.swappiness"]: added "10"`,
			`live    machine.files[0]: added`,
			`live    cluster.nodeLabels["cairn.dev/applied"]: added "live"`,
			"generation 1: dry run: nothing changed",
		} {
			if !strings.Contains(out, want) {
				t.Errorf("cairn node apply --mode dry-run printed:\n%s\nwant %q", out, want)
			}
		}
		if got := swappiness(); got != bootSwappiness {
			t.Errorf("vm.swappiness = %s after a dry run, want %s", got, bootSwappiness)
		}
	})

	t.Run("Invalid", func(t *testing.T) {
		bad := nodeConfigDoc(t, config, func(cfg *machineconfig.Config) {
			cfg.Machine.Sysctls = map[string]string{"vm.swappiness": swappinessLive}
			cfg.Machine.Files = []machineconfig.File{{Path: "/usr/lib/x", Content: "x"}}
		})
		_, err := c.ApplyConfig(ctx, &machine.ApplyConfigRequest{Config: bad})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "machine.files[0].path") {
			t.Errorf("ApplyConfig(invalid) = %v, want InvalidArgument naming machine.files[0].path", err)
		}
		if got := swappiness(); got != bootSwappiness {
			t.Errorf("vm.swappiness = %s after an invalid config, want %s", got, bootSwappiness)
		}
	})

	t.Run("Live", func(t *testing.T) {
		servicesBefore := services(t, ctx, c)
		agentBefore := servicesBefore["cairn-agent"]
		t0 := time.Now()
		resp, err := c.ApplyConfig(ctx, &machine.ApplyConfigRequest{Config: live, Mode: machine.ApplyMode_APPLY_MODE_AUTO})
		took := time.Since(t0)
		if err != nil || resp.Outcome != "applied live" || resp.Generation != 2 {
			t.Fatalf("ApplyConfig(live, auto) = %v, %v; want applied live as generation 2", resp, err)
		}
		// The call returns once init applied it: the kernel has it.
		if got := swappiness(); got != swappinessLive {
			t.Errorf("vm.swappiness = %s once applied, want %s", got, swappinessLive)
		}
		if got, err := readNode(ctx, c, appliedFile); err != nil || got != "applied=live" {
			t.Errorf("%s = %q, %v; want the file applied", appliedFile, got, err)
		}
		all := waitService(t, ctx, c, "hello-live", "Ready, and unreachable gone", func(s map[string]*machine.ServiceStatus) bool {
			return s["hello-live"].GetState() == "Ready" && s["unreachable"] == nil
		})
		if hello := all["hello"]; hello.GetPid() != servicesBefore["hello"].GetPid() || hello.GetRestarts() != servicesBefore["hello"].GetRestarts() {
			t.Errorf("hello after the apply: %v; want the same run as before (%v)", hello, servicesBefore["hello"])
		}
		if v, err := c.Version(ctx, &machine.VersionRequest{}); err != nil || !slices.Contains(v.GetAddresses(), liveAddress) || !slices.Contains(v.GetAddresses(), isolatedAddress) {
			t.Errorf("Version().Addresses = %v, %v; want %s added beside %s", v.GetAddresses(), err, liveAddress, isolatedAddress)
		}
		// The agent's memory limit, as the kernel enforces it, changed
		// under the same process.
		agent := services(t, ctx, c)["cairn-agent"]
		if agent.Pid != agentBefore.Pid || agent.Limits.GetMemoryMax() != "734003200" || agent.Limits.GetCpuMax() != agentBefore.Limits.GetCpuMax() {
			t.Errorf("cairn-agent after the apply: pid %d (was %d), limits %v (were %v); want the same process with memory.max 700 MiB", agent.Pid, agentBefore.Pid, agent.Limits, agentBefore.Limits)
		}
		poll.Until(t, time.Minute, "the Node labelled from the applied config", func() error {
			n, err := kc.Client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if v := n.Labels["cairn.dev/applied"]; v != "live" {
				return fmt.Errorf("label cairn.dev/applied = %q", v)
			}
			return nil
		})
		after, err := c.Version(ctx, &machine.VersionRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if after.Uptime.AsDuration() < before.Uptime.AsDuration() || after.Config.Generation != 2 || after.Config.BootGeneration != 2 {
			t.Errorf("after the live apply: uptime %s (was %s), config %v; want no reboot, generation 2 running and in STATE",
				after.Uptime.AsDuration(), before.Uptime.AsDuration(), after.Config)
		}
		t.Logf("apply live: call to applied %s", took.Round(time.Millisecond))
	})

	t.Run("TryReverted", func(t *testing.T) {
		tried := nodeConfigDoc(t, config, func(cfg *machineconfig.Config) {
			cfg.Machine.Sysctls = map[string]string{"vm.swappiness": swappinessTried}
			cfg.Machine.Files = []machineconfig.File{{Path: appliedFile, Content: "applied=live\n"}}
			cfg.Cluster.NodeLabels = map[string]string{"cairn.dev/applied": "live"}
		})
		resp, err := c.ApplyConfig(ctx, &machine.ApplyConfigRequest{Config: tried, Mode: machine.ApplyMode_APPLY_MODE_TRY, TryTimeout: durationpb.New(5 * time.Second)})
		if err != nil || !strings.HasPrefix(resp.Outcome, "trying until") {
			t.Fatalf("ApplyConfig(try) = %v, %v", resp, err)
		}
		if got := swappiness(); got != swappinessTried {
			t.Errorf("vm.swappiness = %s while trying, want %s", got, swappinessTried)
		}
		poll.Until(t, time.Minute, "the try reverted", func() error {
			v, err := c.Version(ctx, &machine.VersionRequest{})
			if err != nil {
				return err
			}
			if v.Config.TryUntil != nil || v.Config.Generation != 2 {
				return fmt.Errorf("config %v", v.Config)
			}
			if !strings.Contains(v.Config.LastError, "reverted: not confirmed") {
				return fmt.Errorf("config %v: the revert not said", v.Config)
			}
			return nil
		})
		if got := swappiness(); got != swappinessLive {
			t.Errorf("vm.swappiness = %s after the try's timeout, want %s back", got, swappinessLive)
		}
	})

	t.Run("Staged", func(t *testing.T) {
		staged := nodeConfigDoc(t, config, func(cfg *machineconfig.Config) {
			cfg.Machine.Sysctls = map[string]string{"vm.swappiness": swappinessStaged}
			cfg.Machine.Files = []machineconfig.File{{Path: appliedFile, Content: "applied=staged\n"}}
			cfg.Cluster.NodeLabels = map[string]string{"cairn.dev/applied": "live"}
		})
		resp, err := c.ApplyConfig(ctx, &machine.ApplyConfigRequest{Config: staged, Mode: machine.ApplyMode_APPLY_MODE_STAGED})
		if err != nil || resp.Outcome != "staged for the next boot" {
			t.Fatalf("ApplyConfig(staged) = %v, %v", resp, err)
		}
		if got := swappiness(); got != swappinessLive {
			t.Errorf("vm.swappiness = %s once staged, want %s until the next boot", got, swappinessLive)
		}
		v, err := c.Version(ctx, &machine.VersionRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if v.Config.Generation != 2 || v.Config.BootGeneration != resp.Generation {
			t.Errorf("Version().Config = %v once staged, want generation 2 running, %d in STATE", v.Config, resp.Generation)
		}
	})
}

// testStagedAfterReboot checks, after a reboot, that the config staged by
// testApplyConfig is the one the node booted with.
func testStagedAfterReboot(t *testing.T, ctx context.Context, c *client.Client) {
	v, err := c.Version(ctx, &machine.VersionRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if v.Config.Generation < 3 || v.Config.Generation != v.Config.BootGeneration {
		t.Errorf("Version().Config = %v after the reboot, want the staged generation running", v.Config)
	}
	// A config written for a boot is kept once the node is healthy.
	poll.Until(t, time.Minute, "the staged config kept", func() error {
		v, err := c.Version(ctx, &machine.VersionRequest{})
		if err != nil {
			return err
		}
		if v.Config.OnTrial || v.Config.LastError != "" {
			return fmt.Errorf("config %v", v.Config)
		}
		return nil
	})
	for path, want := range map[string]string{"/proc/sys/vm/swappiness": swappinessStaged, appliedFile: "applied=staged"} {
		if got, err := readNode(ctx, c, path); err != nil || got != want {
			t.Errorf("%s = %q, %v after the reboot; want %q from the staged config", path, got, err, want)
		}
	}
	if _, err := c.ConfirmConfig(ctx, &machine.ConfirmConfigRequest{}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("ConfirmConfig() with no try = %v, want FailedPrecondition", err)
	}
}
