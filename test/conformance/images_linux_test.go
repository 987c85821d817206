package conformance

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cairn-os/cairn/test/poll"
	"github.com/cairn-os/cairn/test/registry"
	"github.com/cairn-os/cairn/test/runtime"
)

// TestBusyboxShellEnv runs `sh -c env` in the busybox image on a real
// containerd, as the ConfigMap and Secret envFrom specs do, with variables
// whose names are no shell names (envFrom keys such as data-1): the shell
// must pass them on to env, as upstream's busybox does.
func TestBusyboxShellEnv(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rt := runtime.Start(t)
	reg := registry.Start(t)
	if err := rt.AllowHTTP(reg.Addr); err != nil {
		t.Fatal(err)
	}
	img, err := busyboxImage(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := registry.Push(ctx, reg, img, "promotere2e/busybox:test"); err != nil {
		t.Fatal(err)
	}
	ref := reg.Addr + "/promotere2e/busybox:test"
	if _, err := rt.ImageClient.PullImage(ctx, &criv1.PullImageRequest{Image: &criv1.ImageSpec{Image: ref}}); err != nil {
		t.Fatalf("pull %s: %v", ref, err)
	}
	sbCfg := &criv1.PodSandboxConfig{
		Metadata:     &criv1.PodSandboxMetadata{Name: "env", Namespace: "default", Uid: "uid-env"},
		LogDirectory: filepath.Join(t.TempDir(), "logs"),
		Linux: &criv1.LinuxPodSandboxConfig{SecurityContext: &criv1.LinuxSandboxSecurityContext{
			NamespaceOptions: &criv1.NamespaceOption{Network: criv1.NamespaceMode_NODE}}},
	}
	sb, err := rt.RuntimeClient.RunPodSandbox(ctx, &criv1.RunPodSandboxRequest{Config: sbCfg})
	if err != nil {
		t.Fatalf("RunPodSandbox: %v", err)
	}
	env := []*criv1.KeyValue{
		{Key: "data-1", Value: []byte("value-1")},
		{Key: "p-data-1", Value: []byte("value-1")},
		{Key: "SHELL_NAME", Value: []byte("ok")},
	}
	c, err := rt.RuntimeClient.CreateContainer(ctx, &criv1.CreateContainerRequest{
		PodSandboxId:  sb.PodSandboxId,
		SandboxConfig: sbCfg,
		Config: &criv1.ContainerConfig{
			Metadata: &criv1.ContainerMetadata{Name: "env-test"},
			Image:    &criv1.ImageSpec{Image: ref},
			Command:  []string{"sh", "-c", "env"},
			Envs:     env,
			LogPath:  "env-test/0.log",
		},
	})
	if err != nil {
		t.Fatalf("CreateContainer: %v", err)
	}
	if _, err := rt.RuntimeClient.StartContainer(ctx, &criv1.StartContainerRequest{ContainerId: c.ContainerId}); err != nil {
		t.Fatalf("StartContainer: %v", err)
	}
	poll.Until(t, 30*time.Second, "env exited", func() error {
		st, err := rt.RuntimeClient.ContainerStatus(ctx, &criv1.ContainerStatusRequest{ContainerId: c.ContainerId})
		if err != nil {
			return err
		}
		if st.Status.State != criv1.ContainerState_CONTAINER_EXITED {
			return fmt.Errorf("state %s", st.Status.State)
		}
		return nil
	})
	lines := runtime.LogLines(t, filepath.Join(sbCfg.LogDirectory, "env-test", "0.log"), len(env))
	for _, kv := range env {
		if want := kv.Key + "=" + string(kv.Value); !slices.Contains(lines, want) {
			t.Errorf("sh -c env printed %q, want %s among its lines", lines, want)
		}
	}
}
