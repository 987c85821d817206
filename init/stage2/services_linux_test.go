package stage2

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/opencontainers/cgroups"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cairn-os/cairn/machineconfig"
	"github.com/cairn-os/cairn/machineconfig/staticpod"
	"github.com/cairn-os/cairn/supervisor"
	"github.com/cairn-os/cairn/test/need"
)

// TestCgroupResources turns the machine config's limits into the
// supervisor's: memory.max in bytes, cpu.max as a quota of 100 ms.
func TestCgroupResources(t *testing.T) {
	pids := int64(64)
	for _, tt := range []struct {
		name string
		r    machineconfig.Resources
		want *cgroups.Resources
	}{
		{"none", machineconfig.Resources{}, nil},
		{
			"all",
			machineconfig.Resources{MemoryMax: "64Mi", CPUMax: "250m", CPUWeight: 50, PidsMax: 64},
			&cgroups.Resources{Memory: 64 << 20, CpuQuota: 25_000, CpuPeriod: 100_000, CpuWeight: 50, PidsLimit: &pids},
		},
		{"memory only", machineconfig.Resources{MemoryMax: "1G"}, &cgroups.Resources{Memory: 1e9}},
		{"two CPUs", machineconfig.Resources{CPUMax: "2"}, &cgroups.Resources{CpuQuota: 200_000, CpuPeriod: 100_000}},
	} {
		if diff := cmp.Diff(tt.want, cgroupResources(tt.r)); diff != "" {
			t.Errorf("%s: cgroupResources(%+v) mismatch (-want +got):\n%s", tt.name, tt.r, diff)
		}
	}
}

// TestEnableControllers delegates, in a cgroup of the test's below the
// host's cgroup v2, every controller it has to its children; a directory
// that is no cgroup is an error.
func TestEnableControllers(t *testing.T) {
	need.Root(t, "cgroups")
	dir := filepath.Join(need.CgroupV2(t), fmt.Sprintf("init-test-%d", os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(dir) })
	if err := enableControllers(dir); err != nil {
		t.Fatalf("enableControllers() = %v", err)
	}
	have, _ := os.ReadFile(filepath.Join(dir, "cgroup.controllers"))
	on, _ := os.ReadFile(filepath.Join(dir, "cgroup.subtree_control"))
	if diff := cmp.Diff(strings.Fields(string(have)), strings.Fields(string(on))); diff != "" {
		t.Errorf("controllers delegated (-available +enabled):\n%s", diff)
	}
	if err := enableControllers(t.TempDir()); err == nil || !strings.Contains(err.Error(), "cgroup.controllers") {
		t.Errorf("enableControllers(no cgroup) = %v, want an error naming cgroup.controllers", err)
	}
}

// TestNodeServices lists containerd with its ready action (the sandbox
// image, at each start), the agent not waiting for it, and the config's
// image services after it; without EPHEMERAL containerd cannot start, and
// says why.
func TestNodeServices(t *testing.T) {
	cfg := &machineconfig.Config{Services: []machineconfig.Service{{Name: "hello", Image: "registry.example/hello:v1", Restart: machineconfig.RestartOnFailure}}}
	cfg.SetDefaults()
	svcs, images := nodeServices(cfg, nil)
	var names []string
	for _, s := range svcs {
		names = append(names, s.Name+" after "+strings.Join(s.DependsOn, ","))
	}
	if diff := cmp.Diff([]string{"containerd after ", "cairn-agent after ", "hello after containerd"}, names); diff != "" {
		t.Errorf("services (-want +got):\n%s", diff)
	}
	containerd := svcs[0]
	if len(containerd.OnReady) != 1 || containerd.OnReady[0].Name != "import the sandbox image" || containerd.OnReady[0].Run == nil {
		t.Errorf("containerd's ready actions %+v, want the sandbox image imported", containerd.OnReady)
	}
	if containerd.Path == "" || containerd.Launcher != nil {
		t.Errorf("containerd: path %q, launcher %v; want its binary", containerd.Path, containerd.Launcher)
	}
	if svcs[2].Restart != supervisor.RestartOnFailure {
		t.Errorf("hello's restart policy %v, want on-failure from the config", svcs[2].Restart)
	}
	if diff := cmp.Diff(map[string]string{"hello": "registry.example/hello:v1"}, images); diff != "" {
		t.Errorf("images (-want +got):\n%s", diff)
	}

	svcs, _ = nodeServices(cfg, errors.New("no EPHEMERAL partition"))
	_, err := svcs[0].Launcher.Launch(context.Background(), supervisor.LaunchOptions{})
	if svcs[0].Path != "" || err == nil || !strings.Contains(err.Error(), "EPHEMERAL is not mounted on /var: no EPHEMERAL partition") {
		t.Errorf("containerd without EPHEMERAL: path %q, launch error %v; want it unable to start, saying why", svcs[0].Path, err)
	}
}

// TestWriteStaticPods writes the config's static pods whole: one manifest
// per pod that the agent's decoder reads back as the pod, root's alone,
// and nothing left of what an earlier boot wrote for a pod no longer in
// the config.
func TestWriteStaticPods(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "static-pods")
	raw := func(name, image string) machineconfig.StaticPod {
		return machineconfig.StaticPod(fmt.Sprintf(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":%q},"spec":{"containers":[{"name":"c","image":%q}]}}`, name, image))
	}
	pod := func(name, image string) corev1.Pod {
		p := corev1.Pod{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"}, ObjectMeta: metav1.ObjectMeta{Name: name}}
		p.Spec.Containers = []corev1.Container{{Name: "c", Image: image}}
		return p
	}
	if err := writeStaticPods(dir, []machineconfig.StaticPod{raw("a", "x:1"), raw("b", "y:1")}); err != nil {
		t.Fatalf("writeStaticPods(a, b) = %v", err)
	}
	if err := os.Chmod(dir, 0o755); err != nil { // as if someone opened it up
		t.Fatal(err)
	}
	want := []corev1.Pod{pod("b", "y:2"), pod("c", "z:1")}
	if err := writeStaticPods(dir, []machineconfig.StaticPod{raw("b", "y:2"), raw("c", "z:1")}); err != nil {
		t.Fatalf("writeStaticPods(b, c) = %v", err)
	}
	st, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o700 {
		t.Errorf("static pod directory mode = %v, want 0700", st.Mode().Perm())
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if diff := cmp.Diff([]string{"b.yaml", "c.yaml"}, names); diff != "" {
		t.Errorf("static pod manifests (-want +got):\n%s", diff)
	}
	for _, p := range want {
		file := filepath.Join(dir, p.Name+".yaml")
		st, err := os.Stat(file)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o600 {
			t.Errorf("%s mode = %v, want 0600", file, st.Mode().Perm())
		}
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		got, err := staticpod.Decode(data)
		if err != nil {
			t.Fatalf("read back %s: %v", file, err)
		}
		if diff := cmp.Diff(&p, got); diff != "" {
			t.Errorf("%s reads back as (-want +got):\n%s", file, diff)
		}
	}
	none := filepath.Join(t.TempDir(), "none")
	if err := writeStaticPods(none, nil); err != nil {
		t.Errorf("writeStaticPods(no pods) = %v, want nil", err)
	}
	if _, err := os.Stat(none); !os.IsNotExist(err) {
		t.Errorf("writeStaticPods(no pods) made %s (%v), want nothing written", none, err)
	}
	if err := writeStaticPods(dir, nil); err != nil {
		t.Fatalf("writeStaticPods(no pods) = %v", err)
	}
	if ents, err := os.ReadDir(dir); err != nil || len(ents) != 0 {
		t.Errorf("after writeStaticPods(no pods), %s holds %d files (%v), want none", dir, len(ents), err)
	}
}
