package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"
	"sigs.k8s.io/yaml"

	"github.com/cairn-os/cairn/agent/drain"
	"github.com/cairn-os/cairn/agent/kubelet/pods"
	"github.com/cairn-os/cairn/machineconfig"
	"github.com/cairn-os/cairn/test/poll"
	"github.com/cairn-os/cairn/test/registry"
	"github.com/cairn-os/cairn/test/runtime"
)

// TestStaticPodsWithoutCluster runs the agent's node part as
// cairn-agent does for a machine config with static pods and no cluster
// section: the pod runs from its manifest, and removing the manifest stops
// it.
func TestStaticPodsWithoutCluster(t *testing.T) {
	rt := runtime.Start(t)
	reg := registry.Start(t)
	if err := rt.AllowHTTP(reg.Addr); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := registry.BuildAndPush(ctx, reg, "./test/images/hello", "cairn-test/hello:v1"); err != nil {
		t.Fatal(err)
	}
	grace := int64(1)
	pod := corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: "hello", Namespace: "default"},
		Spec: corev1.PodSpec{HostNetwork: true, TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{Name: "hello", Image: reg.Addr + "/cairn-test/hello:v1"}}},
	}
	podJSON, err := json.Marshal(&pod)
	if err != nil {
		t.Fatal(err)
	}
	cfg := &machineconfig.Config{Machine: machineconfig.Machine{Hostname: "alone-1", StaticPods: []machineconfig.StaticPod{podJSON}}}
	paths := nodePaths{criSocket: rt.Socket, podLogRoot: filepath.Join(t.TempDir(), "pods"),
		staticPodDir: filepath.Join(t.TempDir(), "static-pods"), kubeletRoot: t.TempDir()}
	// As init writes it.
	if err := os.Mkdir(paths.staticPodDir, 0o700); err != nil {
		t.Fatal(err)
	}
	manifest := filepath.Join(paths.staticPodDir, "hello.yaml")
	data, err := yaml.Marshal(&pod)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(manifest, data, 0o600); err != nil {
		t.Fatal(err)
	}
	nctx, stop := context.WithCancel(context.Background())
	done := startNode(nctx, cfg, "", t.TempDir(), paths, prometheus.NewRegistry(), drain.New(filepath.Join(t.TempDir(), drainMarker), slog.Default()), &podsEnding{})
	defer func() {
		stop()
		<-done
	}()
	// containers counts the pod's containers in the runtime, and those
	// of them running.
	containers := func() (all, running int, err error) {
		resp, err := rt.RuntimeClient.ListContainers(context.Background(), &criv1.ListContainersRequest{Filter: &criv1.ContainerFilter{
			LabelSelector: map[string]string{pods.LabelPodName: "hello-alone-1"},
		}})
		if err != nil {
			return 0, 0, err
		}
		for _, c := range resp.Containers {
			if c.State == criv1.ContainerState_CONTAINER_RUNNING {
				running++
			}
		}
		return len(resp.Containers), running, nil
	}
	poll.Until(t, 60*time.Second, "static pod hello-alone-1 running", func() error {
		all, running, err := containers()
		if err != nil {
			return err
		}
		if all != 1 || running != 1 {
			return fmt.Errorf("%d containers, %d running, want one running", all, running)
		}
		return nil
	})
	if err := os.Remove(manifest); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 30*time.Second, "static pod hello-alone-1 removed", func() error {
		all, _, err := containers()
		if err != nil {
			return err
		}
		if all != 0 {
			return fmt.Errorf("%d containers left", all)
		}
		return nil
	})
}
