//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cairn-os/cairn/api/client"
	"github.com/cairn-os/cairn/api/machine"
	"github.com/cairn-os/cairn/internal/layout"
	"github.com/cairn-os/cairn/machineconfig"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"
)

// testServices checks, on a booted node, the supervised services: states,
// their cgroup limits as the kernel has them, the image service pulled from
// the host's registry and its logs, the one whose registry is unreachable,
// containerd's restart and a crash of it, which the image service outlives.
// cfg is the node's machine config.
func testServices(t *testing.T, ctx context.Context, c *client.Client, cfg *machineconfig.Config) {
	waitService(t, ctx, c, "containerd", "Ready, and hello running", func(s map[string]*machine.ServiceStatus) bool {
		return s["containerd"].GetState() == "Ready" && s["cairn-agent"].GetState() == "Ready" && s["hello"].GetState() == "Ready"
	})

	t.Run("CgroupLimitsReadBack", func(t *testing.T) {
		want := map[string]machineconfig.Resources{
			"containerd":  cfg.Machine.Resources.Containerd,
			"cairn-agent": cfg.Machine.Resources.Agent,
		}
		for _, s := range cfg.Services {
			want[s.Name] = s.Resources
		}
		got := services(t, ctx, c)
		for name, r := range want {
			if name == "unreachable" {
				continue // never runs: no process, no cgroup to read
			}
			w := wantLimits("/system/"+name, r)
			if diff := cmp.Diff(w, got[name].GetLimits(), protocmp.Transform()); diff != "" {
				t.Errorf("%s: limits read back from the node (-want +got):\n%s", name, diff)
			}
		}
	})

	t.Run("ImageServiceLogs", func(t *testing.T) {
		var out string
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
			out = logs(t, ctx, c, &machine.LogsRequest{Service: "hello", TailLines: 20})
			if strings.Contains(out, "hello from cairn-test-image") {
				break
			}
		}
		if !strings.Contains(out, "hello from cairn-test-image") || !strings.Contains(out, "args=--from-config") {
			t.Errorf("logs of hello = %q, want its first line with the config's args", out)
		}
	})

	t.Run("UnreachableRegistryBacksOff", func(t *testing.T) {
		// Between two tries the status may be caught restarting, with no
		// reason yet: wait for a sight of the backoff that names the pull.
		waitService(t, ctx, c, "unreachable", "in Backoff naming the failed pull", func(s map[string]*machine.ServiceStatus) bool {
			u := s["unreachable"]
			return (u.GetState() == "Backoff" || u.GetRestarts() > 0) &&
				strings.Contains(u.GetReason()+u.GetLastExit(), "pull 10.0.2.2:1/cairn-test/none:v1")
		})
	})

	t.Run("Containers", func(t *testing.T) {
		// init imports the sandbox image once containerd is ready: allow it
		// a moment.
		var resp *machine.ContainersResponse
		for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(time.Second) {
			var err error
			if resp, err = c.Containers(ctx, &machine.ContainersRequest{}); err != nil {
				t.Fatal(err)
			}
			if hasContainer(resp, "system", "hello", "cairn-test/hello:v1") && hasImage(resp, "k8s.io", layout.SandboxImage) {
				return
			}
		}
		t.Errorf("Containers() = %v, want hello running in namespace system and %s in k8s.io", resp.Namespaces, layout.SandboxImage)
	})

	t.Run("FollowLogs", func(t *testing.T) {
		fctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		stream, err := c.Logs(fctx, &machine.LogsRequest{Service: "hello", TailLines: 1, Follow: true})
		if err != nil {
			t.Fatal(err)
		}
		var got bytes.Buffer
		for n := 0; n < 2; n++ { // the tail line, then a new one
			chunk, err := stream.Recv()
			if err != nil {
				t.Fatalf("after %q: %v", got.String(), err)
			}
			got.Write(chunk.Data)
		}
		if strings.Count(got.String(), "tick") < 1 {
			t.Errorf("followed logs = %q, want a new tick line", got.String())
		}
	})

	t.Run("RestartContainerd", func(t *testing.T) {
		all := services(t, ctx, c)
		before, hello := all["containerd"], all["hello"]
		tick := lastTick(t, ctx, c)
		if _, err := c.ServiceRestart(ctx, &machine.ServiceRestartRequest{Name: "containerd"}); err != nil {
			t.Fatal(err)
		}
		waitService(t, ctx, c, "containerd", "Ready after restart", func(s map[string]*machine.ServiceStatus) bool {
			return s["containerd"].GetState() == "Ready" && s["containerd"].GetRestarts() == before.Restarts+1
		})
		t.Run("HelloKeepsRunning", func(t *testing.T) { checkHelloKept(t, ctx, c, hello, tick) })
	})

	t.Run("KillContainerd", func(t *testing.T) {
		all := services(t, ctx, c)
		before, hello := all["containerd"], all["hello"]
		tick := lastTick(t, ctx, c)
		killed := time.Now()
		if _, err := c.ServiceKill(ctx, &machine.ServiceKillRequest{Name: "containerd", Signal: 9}); err != nil {
			t.Fatal(err)
		}
		s := waitService(t, ctx, c, "containerd", "Ready after kill -9", func(s map[string]*machine.ServiceStatus) bool {
			return s["containerd"].GetState() == "Ready" && s["containerd"].GetPid() != before.Pid
		})["containerd"]
		t.Logf("containerd Ready again %s after kill -9 (restarts %d)", time.Since(killed).Round(100*time.Millisecond), s.Restarts)
		if s.LastExit != "killed by signal killed" {
			t.Errorf("containerd last exit = %q, want killed by signal killed", s.LastExit)
		}
		if s := services(t, ctx, c)["cairn-agent"]; s.Restarts != 0 {
			t.Errorf("cairn-agent restarted %d times while containerd crashed (last exit %q), want 0; its log:\n%s", s.Restarts, s.LastExit, logs(t, ctx, c, &machine.LogsRequest{Service: "cairn-agent", TailLines: 60}))
		}
		t.Run("HelloKeepsRunning", func(t *testing.T) { checkHelloKept(t, ctx, c, hello, tick) })
	})
}

// wantLimits is what the cgroup files of a service in cgroup say for the
// limits r of the machine config: the kernel's defaults where r sets none.
func wantLimits(cgroup string, r machineconfig.Resources) *machine.CgroupLimits {
	l := &machine.CgroupLimits{Cgroup: cgroup, MemoryMax: "max", CpuMax: fmt.Sprintf("max %d", machineconfig.CPUPeriod), CpuWeight: "100", PidsMax: "max"}
	if b := r.MemoryBytes(); b > 0 {
		l.MemoryMax = strconv.FormatInt(b, 10)
	}
	if q := r.CPUQuota(); q > 0 {
		l.CpuMax = fmt.Sprintf("%d %d", q, machineconfig.CPUPeriod)
	}
	if r.CPUWeight > 0 {
		l.CpuWeight = strconv.FormatInt(r.CPUWeight, 10)
	}
	if r.PidsMax > 0 {
		l.PidsMax = strconv.FormatInt(r.PidsMax, 10)
	}
	return l
}

var tickRE = regexp.MustCompile(`(?m)^tick ([0-9]+)$`)

// lastTick returns the number of the last "tick N" line hello printed.
func lastTick(t *testing.T, ctx context.Context, c *client.Client) int {
	t.Helper()
	m := tickRE.FindAllStringSubmatch(logs(t, ctx, c, &machine.LogsRequest{Service: "hello", TailLines: 5}), -1)
	if len(m) == 0 {
		return 0
	}
	n, _ := strconv.Atoi(m[len(m)-1][1])
	return n
}

// checkHelloKept wants hello, after containerd went away and came back,
// to be the same run as before: same process, no restart, its output going
// on from tick, the last line seen before.
func checkHelloKept(t *testing.T, ctx context.Context, c *client.Client, before *machine.ServiceStatus, tick int) {
	t.Helper()
	now := services(t, ctx, c)["hello"]
	if now.GetState() != "Ready" || now.GetPid() != before.GetPid() || now.GetRestarts() != before.GetRestarts() ||
		!now.GetStartedAt().AsTime().Equal(before.GetStartedAt().AsTime()) {
		t.Errorf("hello after containerd came back: %s pid %d restarts %d started %s; want Ready, pid %d, restarts %d, started %s as before",
			now.GetState(), now.GetPid(), now.GetRestarts(), now.GetStartedAt().AsTime(), before.GetPid(), before.GetRestarts(), before.GetStartedAt().AsTime())
	}
	// hello ticks every 5 s: a later tick from the same process shows its
	// output still reaches the node's logs.
	var after int
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(time.Second) {
		if after = lastTick(t, ctx, c); after > tick {
			break
		}
	}
	if after <= tick {
		t.Errorf("hello's last tick = %d, want one after tick %d, from the same run", after, tick)
	}
	out := logs(t, ctx, c, &machine.LogsRequest{Service: "hello", TailLines: 20})
	if i := strings.Index(out, fmt.Sprintf("tick %d\n", tick)); i >= 0 {
		out = out[i:]
	}
	if strings.Contains(out, "hello from") || strings.Contains(out, "exited") {
		t.Errorf("hello's lines since tick %d = %q, want no exit and no new start", tick, out)
	}
}

func services(t *testing.T, ctx context.Context, c *client.Client) map[string]*machine.ServiceStatus {
	t.Helper()
	resp, err := c.Services(ctx, &machine.ServicesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]*machine.ServiceStatus{}
	for _, s := range resp.Services {
		m[s.Name] = s
	}
	return m
}

// waitService polls Services for up to 3 minutes until cond holds.
func waitService(t *testing.T, ctx context.Context, c *client.Client, name, what string, cond func(map[string]*machine.ServiceStatus) bool) map[string]*machine.ServiceStatus {
	t.Helper()
	var last map[string]*machine.ServiceStatus
	for deadline := time.Now().Add(3 * time.Minute); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		if last = services(t, ctx, c); cond(last) {
			return last
		}
	}
	t.Fatalf("%s not %s after 3 minutes: %s", name, what, describe(last))
	return nil
}

func describe(s map[string]*machine.ServiceStatus) string {
	var b strings.Builder
	for n, st := range s {
		fmt.Fprintf(&b, "\n  %s: %s ready=%t restarts=%d last=%q reason=%q", n, st.State, st.Ready, st.Restarts, st.LastExit, st.Reason)
	}
	return b.String()
}

func logs(t *testing.T, ctx context.Context, c *client.Client, req *machine.LogsRequest) string {
	t.Helper()
	out, err := readStream(c.Logs(ctx, req))
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func hasContainer(resp *machine.ContainersResponse, ns, id, image string) bool {
	for _, n := range resp.Namespaces {
		for _, c := range n.Containers {
			if n.Name == ns && c.Id == id && c.Status == "running" && strings.Contains(c.Image, image) {
				return true
			}
		}
	}
	return false
}

func hasImage(resp *machine.ContainersResponse, ns, name string) bool {
	for _, n := range resp.Namespaces {
		for _, img := range n.Images {
			if n.Name == ns && img.Name == name {
				return true
			}
		}
	}
	return false
}
