//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cairn-os/cairn/api/client"
	"github.com/cairn-os/cairn/api/machine"
	"github.com/cairn-os/cairn/internal/layout"
)

// testServices checks, on a booted node, the supervised services: states,
// the image service pulled from the host's registry and its logs, the one
// whose registry is unreachable, containerd's restart and a crash of it.
func testServices(t *testing.T, ctx context.Context, c *client.Client) {
	waitService(t, ctx, c, "containerd", "Ready, and hello running", func(s map[string]*machine.ServiceStatus) bool {
		return s["containerd"].GetState() == "Ready" && s["cairn-agent"].GetState() == "Ready" && s["hello"].GetState() == "Ready"
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
		s := waitService(t, ctx, c, "unreachable", "in Backoff", func(s map[string]*machine.ServiceStatus) bool {
			return s["unreachable"].GetState() == "Backoff" || s["unreachable"].GetRestarts() > 0
		})["unreachable"]
		if !strings.Contains(s.Reason+s.LastExit, "pull 10.0.2.2:1/cairn-test/none:v1") {
			t.Errorf("unreachable: reason %q, last exit %q; want the failed pull named", s.Reason, s.LastExit)
		}
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
		before := services(t, ctx, c)["containerd"]
		if _, err := c.ServiceRestart(ctx, &machine.ServiceRestartRequest{Name: "containerd"}); err != nil {
			t.Fatal(err)
		}
		waitService(t, ctx, c, "containerd", "Ready after restart", func(s map[string]*machine.ServiceStatus) bool {
			return s["containerd"].GetState() == "Ready" && s["containerd"].GetRestarts() == before.Restarts+1
		})
	})

	t.Run("KillContainerd", func(t *testing.T) {
		before := services(t, ctx, c)["containerd"]
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
			t.Errorf("cairn-agent restarted %d times while containerd crashed, want 0", s.Restarts)
		}
	})
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
