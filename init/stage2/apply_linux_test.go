package stage2

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"golang.org/x/sys/unix"

	"github.com/opencontainers/cgroups"

	"github.com/cairn-os/cairn/api/machine"
	"github.com/cairn-os/cairn/machineconfig"
	"github.com/cairn-os/cairn/test/poll"
)

// applyNode is a node's config state on the test's own files and, in a
// network namespace of the test's, the kernel's own parameters.
type applyNode struct {
	t       *testing.T
	dir     string
	c       *configs
	base    *machineconfig.Config
	reboots int
}

// newApplyNode boots a node on base, as the boot does: STATE's config
// loaded, its sysctls set.
func newApplyNode(t *testing.T) *applyNode {
	t.Helper()
	b, err := machineconfig.Generate(machineconfig.GenerateOptions{Hostname: "node-1"})
	if err != nil {
		t.Fatal(err)
	}
	b.Config.Machine.Sysctls = map[string]string{"net.ipv4.ip_default_ttl": "50"}
	dir := t.TempDir()
	for _, d := range []string{"etc", "var", "state"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	a := &applyNode{t: t, dir: dir, base: b.Config}
	doc := a.doc(b.Config)
	state := filepath.Join(dir, "state", "config.yaml")
	if err := os.WriteFile(state, doc, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := machineconfig.Parse(doc)
	if err != nil {
		t.Fatal(err)
	}
	live := liveTargets{procSys: procSys, root: dir, staticPodDir: filepath.Join(dir, "state", "static-pods")}
	a.c, err = newConfigs(state, filepath.Join(dir, "run", "config.yaml"), live, cfg, doc, false, func() { a.reboots++ })
	if err != nil {
		t.Fatal(err)
	}
	was, err := applySysctls(procSys, cfg.Machine.Sysctls)
	if err != nil {
		t.Fatal(err)
	}
	a.c.rememberSysctls(was)
	return a
}

func (a *applyNode) doc(cfg *machineconfig.Config) []byte {
	a.t.Helper()
	data, err := cfg.Marshal()
	if err != nil {
		a.t.Fatal(err)
	}
	return data
}

// edited is the base config changed by edit.
func (a *applyNode) edited(edit func(*machineconfig.Config)) []byte {
	a.t.Helper()
	cfg, err := machineconfig.Parse(a.doc(a.base))
	if err != nil {
		a.t.Fatal(err)
	}
	edit(cfg)
	return a.doc(cfg)
}

func (a *applyNode) apply(doc []byte, mode machine.ApplyMode, try time.Duration) (*machine.ApplyConfigResponse, error) {
	req := &machine.ApplyConfigRequest{Config: doc, Mode: mode}
	if try > 0 {
		req.TryTimeout = durationpb.New(try)
	}
	return a.c.Apply(req)
}

func (a *applyNode) read(rel string) string {
	a.t.Helper()
	data, err := os.ReadFile(filepath.Join(a.dir, rel))
	if errors.Is(err, os.ErrNotExist) {
		return "(none)"
	}
	if err != nil {
		a.t.Fatal(err)
	}
	return string(data)
}

func sysctl(t *testing.T, name string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(procSys, machineconfig.SysctlPath(name)))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(data))
}

// applied is what the test checks after each call: the config in STATE and
// the one the node runs, their generations, a sysctl, a file.
type applied struct {
	stateGen, runningGen uint64
	bootGen, gen         uint64
	ttl, file            string
}

func (a *applyNode) state() applied {
	a.t.Helper()
	stateGen, _ := splitGeneration([]byte(a.read("state/config.yaml")))
	runningGen, _ := splitGeneration([]byte(a.read("run/config.yaml")))
	s := a.c.Status()
	return applied{stateGen: stateGen, runningGen: runningGen, bootGen: s.BootGeneration, gen: s.Generation,
		ttl: sysctl(a.t, "net.ipv4.ip_default_ttl"), file: a.read("etc/app/app.conf")}
}

func wantCode(t *testing.T, what string, err error, code codes.Code, text string) {
	t.Helper()
	if status.Code(err) != code || !strings.Contains(err.Error(), text) {
		t.Errorf("%s = %v, want %s saying %q", what, err, code, text)
	}
}

// TestApplyConfig applies configs in every mode to a node's config state,
// with the kernel's sysctls of a network namespace of the test's and
// files in a directory of its own, and checks after each call what the
// node runs, what STATE holds, and which generation each is.
func TestApplyConfig(t *testing.T) {
	if !inNamespaces(t, syscall.CLONE_NEWNET|syscall.CLONE_NEWNS) {
		return
	}
	// resolv.conf and hosts are written at their paths: on a tmpfs.
	if err := unix.Mount("tmpfs", "/etc", "tmpfs", 0, "mode=0755"); err != nil {
		t.Fatal(err)
	}
	a := newApplyNode(t)
	a.c.setResolver(newResolver(a.base.Network))
	clock := newTimeKeeper(nil, &recordingClock{})
	a.c.setTimeKeeper(clock)
	limits := &recordingLimits{}
	a.c.setServices(limits)
	links := &recordingLinks{}
	a.c.setLinks(links)
	if len(a.base.Network.Interfaces) == 0 {
		t.Fatal("the generated config has no interface")
	}
	timeServers := func() []string {
		clock.mu.Lock()
		defer clock.mu.Unlock()
		return clock.servers
	}
	boot := sysctl(t, "net.ipv4.tcp_keepalive_time")
	booted := applied{stateGen: 1, runningGen: 1, bootGen: 1, gen: 1, ttl: "50", file: "(none)"}
	if got := a.state(); got != booted {
		t.Fatalf("booted: %+v, want %+v", got, booted)
	}
	stateDoc := a.read("state/config.yaml")

	live := a.edited(func(c *machineconfig.Config) {
		c.Machine.Sysctls["net.ipv4.ip_default_ttl"] = "60"
		c.Machine.Sysctls["net.ipv4.tcp_keepalive_time"] = "600"
		c.Machine.Files = []machineconfig.File{{Path: "/etc/app/app.conf", Content: "level=info\n"}}
		c.Network.Nameservers = []string{"192.0.2.53"}
		c.Network.SearchDomains = []string{"example.com"}
		c.Network.ExtraHostEntries = []machineconfig.HostEntry{{IP: "192.0.2.80", Aliases: []string{"registry.example.com"}}}
		c.Containerd.Registries = []machineconfig.Registry{{Host: "registry.example.com", Endpoints: []string{"http://192.0.2.80:5000"}}}
		c.Machine.Time.Servers = []string{"192.0.2.123"}
		c.Machine.Resources.Agent = machineconfig.Resources{MemoryMax: "512Mi", PidsMax: 100}
		c.Services = append(c.Services, machineconfig.Service{Name: "extra", Image: "registry.example.com/extra:1"})
		c.Network.Interfaces[0].Addresses = append(c.Network.Interfaces[0].Addresses, "192.0.2.77/24")
	})
	t.Run("DryRun", func(t *testing.T) {
		resp, err := a.apply(live, machine.ApplyMode_APPLY_MODE_DRY_RUN, 0)
		if err != nil {
			t.Fatal(err)
		}
		var lines []string
		for _, c := range resp.Changes {
			if c.Reboot {
				t.Errorf("change %s needs a reboot, want it live", c.Text)
			}
			lines = append(lines, c.Text)
		}
		for _, want := range []string{`machine.sysctls["net.ipv4.ip_default_ttl"]: "50" → "60"`, `machine.sysctls["net.ipv4.tcp_keepalive_time"]: added "600"`, "machine.files[0]: added"} {
			if !strings.Contains(strings.Join(lines, "\n"), want) {
				t.Errorf("dry run changes:\n%s\nwant %q", strings.Join(lines, "\n"), want)
			}
		}
		if got := a.state(); got != booted || a.read("state/config.yaml") != stateDoc {
			t.Errorf("after a dry run: %+v, want nothing changed: %+v", got, booted)
		}
	})

	t.Run("Invalid", func(t *testing.T) {
		bad := a.edited(func(c *machineconfig.Config) {
			c.Machine.Hostname = "Not_A_Hostname"
			c.Machine.Files = []machineconfig.File{{Path: "/usr/x", Content: "x"}}
		})
		_, err := a.apply(bad, machine.ApplyMode_APPLY_MODE_AUTO, 0)
		wantCode(t, "Apply(invalid)", err, codes.InvalidArgument, "machine.hostname")
		wantCode(t, "Apply(invalid)", err, codes.InvalidArgument, "machine.files[0].path")
		if got := a.state(); got != booted {
			t.Errorf("after an invalid config: %+v, want nothing changed: %+v", got, booted)
		}
	})

	t.Run("Live", func(t *testing.T) {
		resp, err := a.apply(live, machine.ApplyMode_APPLY_MODE_AUTO, 0)
		if err != nil || resp.Outcome != "applied live" || resp.Generation != 2 {
			t.Fatalf("Apply(live, auto) = %v, %v; want applied live as generation 2", resp, err)
		}
		want := applied{stateGen: 2, runningGen: 2, bootGen: 2, gen: 2, ttl: "60", file: "level=info\n"}
		if got := a.state(); got != want {
			t.Errorf("after a live apply: %+v, want %+v", got, want)
		}
		if got := sysctl(t, "net.ipv4.tcp_keepalive_time"); got != "600" {
			t.Errorf("tcp_keepalive_time = %s, want 600", got)
		}
		for path, want := range map[string]string{
			"/etc/resolv.conf": "search example.com\nnameserver 192.0.2.53\n",
			"/etc/hosts":       hostsMarker + "192.0.2.80 registry.example.com\n",
		} {
			if data, err := os.ReadFile(path); err != nil || string(data) != want {
				t.Errorf("%s = %q, %v; want %q", path, data, err, want)
			}
		}
		if hosts := a.read("etc/containerd/certs.d/registry.example.com/hosts.toml"); !strings.Contains(hosts, "http://192.0.2.80:5000") {
			t.Errorf("containerd's hosts.toml for the registry:\n%s\nwant its endpoint", hosts)
		}
		if got := timeServers(); !slices.Equal(got, []string{"192.0.2.123"}) {
			t.Errorf("the time keeper's servers = %v, want the config's", got)
		}
		if got := limits.take(); len(got) != 1 || got[0].name != "cairn-agent" || got[0].res == nil || got[0].res.Memory != 512<<20 || *got[0].res.PidsLimit != 100 {
			t.Errorf("limits set %+v, want cairn-agent's alone: 512 MiB, 100 pids", got)
		}
		if got := links.calls; len(got) != 1 || !slices.Contains(got[0].Interfaces[0].Addresses, "192.0.2.77/24") {
			t.Errorf("links reconfigured %+v, want once, with the address added", got)
		}
		if got := limits.replaced; len(got) != 1 || len(got[0][1]) != len(a.base.Services)+1 || got[0][1][len(got[0][1])-1].Name != "extra" {
			t.Errorf("services replaced %+v, want once, with extra added", got)
		}
		if got := a.read("state/config.yaml.previous"); got != stateDoc {
			t.Errorf("STATE's previous config:\n%s\nwant the one it replaced", got)
		}
		if a.reboots != 0 {
			t.Error("a live apply rebooted the node")
		}
		if resp, err := a.apply(live, machine.ApplyMode_APPLY_MODE_AUTO, 0); err != nil || resp.Outcome != "no change" {
			t.Errorf("Apply(the same again) = %v, %v; want no change", resp, err)
		}

		// Dropped from the config: the sysctl the boot did not set gets
		// back its value from before, the file goes.
		resp, err = a.apply(a.doc(a.base), machine.ApplyMode_APPLY_MODE_NO_REBOOT, 0)
		if err != nil || resp.Generation != 3 {
			t.Fatalf("Apply(base, no-reboot) = %v, %v; want generation 3", resp, err)
		}
		want = applied{stateGen: 3, runningGen: 3, bootGen: 3, gen: 3, ttl: "50", file: "(none)"}
		if got := a.state(); got != want {
			t.Errorf("after dropping them: %+v, want %+v", got, want)
		}
		if got := sysctl(t, "net.ipv4.tcp_keepalive_time"); got != boot {
			t.Errorf("tcp_keepalive_time = %s, want %s, its value before the node set it", got, boot)
		}
		if got := limits.take(); len(got) != 1 || got[0].name != "cairn-agent" || got[0].res != nil {
			t.Errorf("limits set %+v, want cairn-agent's lifted", got)
		}
		if _, err := os.Stat(filepath.Join(a.dir, "etc/containerd/certs.d/registry.example.com")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the dropped registry's hosts directory: %v, want it removed", err)
		}
		for path, want := range map[string]string{"/etc/resolv.conf": "", "/etc/hosts": ""} {
			if data, err := os.ReadFile(path); err != nil || string(data) != want {
				t.Errorf("%s = %q, %v; want %q once dropped", path, data, err, want)
			}
		}
		if got := timeServers(); len(got) != 0 || clock.timeSync() != nil {
			t.Errorf("the time keeper's servers = %v once dropped, want none", got)
		}
	})
	at := a.state()

	t.Run("FailedLiveUndone", func(t *testing.T) {
		doc := a.edited(func(c *machineconfig.Config) {
			c.Machine.Sysctls["net.ipv4.ip_default_ttl"] = "70"
			c.Machine.Sysctls["net.ipv4.no_such_parameter"] = "1"
			c.Machine.Files = []machineconfig.File{{Path: "/etc/app/app.conf", Content: "x"}}
		})
		_, err := a.apply(doc, machine.ApplyMode_APPLY_MODE_AUTO, 0)
		wantCode(t, "Apply(unknown sysctl)", err, codes.FailedPrecondition, "no_such_parameter")
		wantCode(t, "Apply(unknown sysctl)", err, codes.FailedPrecondition, "the node keeps generation 3")
		if got := a.state(); got != at {
			t.Errorf("after a failed live apply: %+v, want all of it undone: %+v", got, at)
		}
	})

	hostname := a.edited(func(c *machineconfig.Config) { c.Machine.Hostname = "node-2" })
	t.Run("NeedsReboot", func(t *testing.T) {
		for _, mode := range []machine.ApplyMode{machine.ApplyMode_APPLY_MODE_NO_REBOOT, machine.ApplyMode_APPLY_MODE_TRY} {
			_, err := a.apply(hostname, mode, time.Minute)
			wantCode(t, "Apply(hostname, "+mode.String()+")", err, codes.FailedPrecondition, "take effect only at a boot: machine.hostname")
		}
		if got := a.state(); got != at || a.reboots != 0 {
			t.Errorf("after refusals: %+v, %d reboots; want nothing changed: %+v", got, a.reboots, at)
		}
	})

	t.Run("Staged", func(t *testing.T) {
		resp, err := a.apply(hostname, machine.ApplyMode_APPLY_MODE_STAGED, 0)
		if err != nil || resp.Outcome != "staged for the next boot" || len(resp.Changes) != 1 || !resp.Changes[0].Reboot {
			t.Fatalf("Apply(hostname, staged) = %v, %v", resp, err)
		}
		want := at
		want.stateGen, want.bootGen = 4, 4
		if got := a.state(); got != want || a.reboots != 0 {
			t.Errorf("after staging: %+v, %d reboots; want %+v, none", got, a.reboots, want)
		}
	})

	t.Run("Reboot", func(t *testing.T) {
		resp, err := a.apply(hostname, machine.ApplyMode_APPLY_MODE_AUTO, 0)
		if err != nil || resp.Outcome != "rebooting" || resp.Generation != 5 || a.reboots != 1 {
			t.Fatalf("Apply(hostname, auto) = %v, %v (%d reboots); want a reboot into generation 5", resp, err, a.reboots)
		}
		if cfg, err := machineconfig.Load(filepath.Join(a.dir, "state/config.yaml")); err != nil || cfg.Machine.Hostname != "node-2" {
			t.Errorf("STATE's config after apply with a reboot: %v, %v; want node-2's", cfg, err)
		}
	})
	// Back to base, as the reboot would have it, for the tries.
	if _, err := a.apply(a.doc(a.base), machine.ApplyMode_APPLY_MODE_STAGED, 0); err != nil {
		t.Fatal(err)
	}
	at = a.state()

	t.Run("TryReverted", func(t *testing.T) {
		resp, err := a.apply(live, machine.ApplyMode_APPLY_MODE_TRY, 500*time.Millisecond)
		if err != nil || !strings.HasPrefix(resp.Outcome, "trying until") {
			t.Fatalf("Apply(live, try) = %v, %v", resp, err)
		}
		tried := applied{stateGen: at.stateGen, runningGen: resp.Generation, bootGen: at.bootGen, gen: resp.Generation, ttl: "60", file: "level=info\n"}
		if got := a.state(); got != tried {
			t.Errorf("while trying: %+v, want %+v (STATE unchanged)", got, tried)
		}
		if a.c.Status().TryUntil == nil {
			t.Error("Status().TryUntil unset while trying")
		}
		_, err = a.apply(hostname, machine.ApplyMode_APPLY_MODE_STAGED, 0)
		wantCode(t, "Apply while trying", err, codes.FailedPrecondition, "is being tried until")
		poll.Until(t, 10*time.Second, "the try reverted", func() error {
			if s := a.c.Status(); s.TryUntil != nil {
				return errors.New("still trying")
			}
			return nil
		})
		if got := a.state(); got != at {
			t.Errorf("after the try's timeout: %+v, want %+v", got, at)
		}
		if s := a.c.Status(); !strings.Contains(s.LastError, "reverted: not confirmed by") {
			t.Errorf("Status().LastError = %q, want the revert said", s.LastError)
		}
		if _, err := a.c.Confirm(); status.Code(err) != codes.FailedPrecondition {
			t.Errorf("Confirm() with no try = %v, want FailedPrecondition", err)
		}
	})

	t.Run("TryConfirmed", func(t *testing.T) {
		resp, err := a.apply(live, machine.ApplyMode_APPLY_MODE_TRY, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		c, err := a.c.Confirm()
		if err != nil || c.Generation != resp.Generation {
			t.Fatalf("Confirm() = %v, %v; want generation %d", c, err, resp.Generation)
		}
		g := resp.Generation
		want := applied{stateGen: g, runningGen: g, bootGen: g, gen: g, ttl: "60", file: "level=info\n"}
		if got := a.state(); got != want || a.c.Status().TryUntil != nil || a.c.Status().LastError != "" {
			t.Errorf("after Confirm: %+v, %v; want %+v, no try, no error", got, a.c.Status(), want)
		}
	})
}

// TestConfigTrial follows a config written for a boot through its
// trial: the first boot with it marks it booted; a boot that finds it
// marked so (the one before never became healthy) goes back to the
// previous config; a healthy boot keeps it; one that is not healthy in
// time reboots.
func TestConfigTrial(t *testing.T) {
	if !inNamespaces(t, syscall.CLONE_NEWNET) { // the node's sysctls
		return
	}
	a := newApplyNode(t)
	state := filepath.Join(a.dir, "state", "config.yaml")
	first := a.read("state/config.yaml")
	second := a.edited(func(c *machineconfig.Config) { c.Machine.Hostname = "node-2" })
	resp, err := a.apply(second, machine.ApplyMode_APPLY_MODE_REBOOT, 0)
	if err != nil || a.reboots != 1 {
		t.Fatalf("Apply(reboot) = %v, %v (%d reboots)", resp, err, a.reboots)
	}
	if got := a.read("state/config.yaml.trial"); got != "2\n" {
		t.Fatalf("trial marker %q after apply with a reboot, want generation 2", got)
	}

	// The boot with it, which never becomes healthy.
	if why, err := checkTrial(state); why != "" || err != nil {
		t.Fatalf("checkTrial() at the first boot = %q, %v; want it marked booted", why, err)
	}
	if got := a.read("state/config.yaml.trial"); got != "2 booted\n" {
		t.Errorf("trial marker %q after the first boot, want 2 booted", got)
	}
	// The next boot goes back.
	why, err := checkTrial(state)
	if err != nil || !strings.Contains(why, "generation 2 reverted to 1 at boot") {
		t.Fatalf("checkTrial() at the next boot = %q, %v; want generation 1 back", why, err)
	}
	if got := a.read("state/config.yaml"); got != first {
		t.Errorf("STATE's config after the revert:\n%s\nwant the first one back", got)
	}
	if got := a.read("state/config.yaml.trial"); got != "(none)" {
		t.Errorf("trial marker %q after the revert, want none", got)
	}
	if why, err := checkTrial(state); why != "" || err != nil {
		t.Errorf("checkTrial() with nothing on trial = %q, %v", why, err)
	}

	// A marker of a config that was never written (a power cut between
	// the two writes) is dropped.
	if err := os.WriteFile(state+trialSuffix, []byte("9\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if why, err := checkTrial(state); why != "" || err != nil || a.read("state/config.yaml.trial") != "(none)" || a.read("state/config.yaml") != first {
		t.Errorf("checkTrial() with a stale marker = %q, %v; want it dropped, the config kept", why, err)
	}

	// A healthy boot keeps it; an unhealthy one reboots in time.
	for _, healthy := range []bool{true, false} {
		a := newApplyNode(t)
		if _, err := a.apply(second, machine.ApplyMode_APPLY_MODE_STAGED, 0); err != nil {
			t.Fatal(err)
		}
		state := filepath.Join(a.dir, "state", "config.yaml")
		if _, err := checkTrial(state); err != nil {
			t.Fatal(err)
		}
		a.c.generation = 2 // as the boot with it loads it
		checks := 0
		done := make(chan struct{})
		go func() {
			defer close(done)
			a.c.keepIfHealthy(func() bool { checks++; return healthy && checks > 2 }, 5*time.Second, nil)
		}()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			t.Fatalf("keepIfHealthy(healthy %v) did not return", healthy)
		}
		marker := a.read("state/config.yaml.trial")
		switch {
		case healthy && (marker != "(none)" || a.reboots != 0 || a.c.Status().OnTrial):
			t.Errorf("healthy boot: marker %q, %d reboots, %v; want the config kept", marker, a.reboots, a.c.Status())
		case !healthy && (marker != "2 booted\n" || a.reboots != 1 || !strings.Contains(a.c.Status().LastError, "did not become healthy")):
			t.Errorf("unhealthy boot: marker %q, %d reboots, %v; want a reboot, the marker kept for the next boot", marker, a.reboots, a.c.Status())
		}
	}
}

// TestApplyInRecovery applies a config to a node that runs on what
// recovery mode salvaged: only a reboot applies it, which writes it to
// STATE for the next boot; and one that comes while another change runs
// is refused.
func TestApplyInRecovery(t *testing.T) {
	good := generatedDoc(t)
	dir := t.TempDir()
	state := filepath.Join(dir, "config.yaml")
	damaged := append([]byte("futureField: 1\n"), good...)
	if err := os.WriteFile(state, damaged, 0o600); err != nil {
		t.Fatal(err)
	}
	rec := machineconfig.Recover(damaged)
	reboots := 0
	c, err := newConfigs(state, filepath.Join(dir, "run", "config.yaml"), liveTargets{}, rec.Config, damaged, true, func() { reboots++ })
	if err != nil {
		t.Fatal(err)
	}
	// One change at a time: while another holds the config, refused.
	c.mu.Lock()
	_, err = c.Apply(&machine.ApplyConfigRequest{Config: good, Mode: machine.ApplyMode_APPLY_MODE_AUTO})
	c.mu.Unlock()
	wantCode(t, "Apply during another change", err, codes.Aborted, "another config change is in progress")
	_, err = c.Apply(&machine.ApplyConfigRequest{Config: good, Mode: machine.ApplyMode_APPLY_MODE_NO_REBOOT})
	wantCode(t, "Apply(no-reboot) in recovery", err, codes.FailedPrecondition, "recovery mode")
	if data, _ := os.ReadFile(state); string(data) != string(damaged) || reboots != 0 {
		t.Fatalf("after a refused apply: STATE changed or %d reboots", reboots)
	}
	resp, err := c.Apply(&machine.ApplyConfigRequest{Config: good, Mode: machine.ApplyMode_APPLY_MODE_AUTO})
	if err != nil || resp.Outcome != "rebooting" || reboots != 1 {
		t.Fatalf("Apply(auto) in recovery = %v, %v (%d reboots); want a reboot", resp, err, reboots)
	}
	if cfg, err := machineconfig.Load(state); err != nil || cfg.Machine.Hostname != "node-1" {
		t.Errorf("STATE's config after the apply: %v; want the good one, which loads", err)
	}
}

// recordingLimits records the limits set and the services replaced, as
// the supervisor would apply them (its own tests prove that).
type recordingLimits struct {
	mu       sync.Mutex
	set      []setLimits
	replaced [][2][]machineconfig.Service
}

func (r *recordingLimits) Replace(old, new []machineconfig.Service) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.replaced = append(r.replaced, [2][]machineconfig.Service{old, new})
	return nil
}

type setLimits struct {
	name string
	res  *cgroups.Resources
}

func (r *recordingLimits) SetResources(name string, res *cgroups.Resources) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.set = append(r.set, setLimits{name, res})
	return nil
}

func (r *recordingLimits) take() []setLimits {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.set
	r.set = nil
	return out
}

// recordingLinks records the networks the links were reconfigured to (the
// links' own tests change real ones).
type recordingLinks struct {
	mu    sync.Mutex
	calls []machineconfig.Network
}

func (r *recordingLinks) Reconfigure(_, new machineconfig.Network) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, new)
	return nil
}
