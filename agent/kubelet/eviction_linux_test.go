package kubelet

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/utils/ptr"

	"github.com/cairn-os/cairn/test/poll"
)

// TestEmptyDirSizeLimit runs, on a node of a real control plane with a
// real containerd, a pod that writes 2 MiB in an emptyDir limited to
// 1 MiB, which the node evicts as the kubelet does (Failed, Evicted, its
// message and the DisruptionTarget condition), beside one that stays
// within its limit and runs on.
func TestEmptyDirSizeLimit(t *testing.T) {
	e, cfg := newPodEnv(t, "evict-1")
	start(t, cfg)
	e.testNodeReady(t)
	pod := func(name, limit string, size int) *corev1.Pod {
		grace := int64(30)
		q := resource.MustParse(limit)
		return e.createPod(t, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
			Spec: corev1.PodSpec{
				TerminationGracePeriodSeconds: &grace,
				Containers: []corev1.Container{{
					Name: "probee", Image: e.probee, ImagePullPolicy: corev1.PullIfNotPresent,
					Env:          []corev1.EnvVar{{Name: "TOUCH_FILE", Value: "/scratch/data"}, {Name: "TOUCH_SIZE", Value: strconv.Itoa(size)}, {Name: "TOUCH_AFTER", Value: "1"}},
					VolumeMounts: []corev1.VolumeMount{{Name: "scratch", MountPath: "/scratch"}},
				}},
				Volumes: []corev1.Volume{{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: &q}}}},
			},
		})
	}
	within := pod("within", "4Mi", 1<<20)
	filler := pod("filler", "1Mi", 2<<20)
	got := waitPod(t, e.c.Client, "default", filler.Name, 90*time.Second, "evicted", func(p *corev1.Pod) bool {
		return p.Status.Phase == corev1.PodFailed
	})
	const msg = `Usage of EmptyDir volume "scratch" exceeds the limit "1Mi". `
	if got.Status.Reason != "Evicted" || got.Status.Message != msg {
		t.Errorf("filler: reason %q, message %q; want Evicted, %q", got.Status.Reason, got.Status.Message, msg)
	}
	var disruption *corev1.PodCondition
	for i := range got.Status.Conditions {
		if got.Status.Conditions[i].Type == corev1.DisruptionTarget {
			disruption = &got.Status.Conditions[i]
		}
	}
	if disruption == nil || disruption.Status != corev1.ConditionTrue || disruption.Reason != "TerminationByKubelet" {
		t.Errorf("filler: DisruptionTarget %+v, want True, TerminationByKubelet", disruption)
	}
	// The pod within its limit wrote its file long ago and was synced
	// since (each pod resyncs every 10 s): it runs on.
	e.waitWakeups(t, wakeResync, 2)
	e.checkRunning(t, within)
}

// TestMemoryEmptyDirCharged runs, on a real containerd, a pod that writes
// 8 MiB in an emptyDir of medium Memory: the pages are the tmpfs's, and
// the kernel charges them to the memory cgroup of the container that
// wrote them (shmem in its memory.stat), so they count against the pod's
// memory, as with the kubelet. This host's memory controller is cgroup
// v1's; the accounting is the same in v2.
func TestMemoryEmptyDirCharged(t *testing.T) {
	e, cfg := newPodEnv(t, "memdir-1")
	start(t, cfg)
	e.testNodeReady(t)
	const size = 8 << 20
	limit := resource.MustParse("16Mi")
	pod := e.createPod(t, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "in-memory", Namespace: "default"},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: ptr.To[int64](1),
			Containers: []corev1.Container{{
				Name: "probee", Image: e.probee, ImagePullPolicy: corev1.PullIfNotPresent,
				Env:          []corev1.EnvVar{{Name: "TOUCH_FILE", Value: "/scratch/data"}, {Name: "TOUCH_SIZE", Value: strconv.Itoa(size)}, {Name: "TOUCH_AFTER", Value: "0"}},
				VolumeMounts: []corev1.VolumeMount{{Name: "scratch", MountPath: "/scratch"}},
			}},
			Volumes: []corev1.Volume{{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{
				Medium: corev1.StorageMediumMemory, SizeLimit: &limit,
			}}}},
		},
	})
	running := waitPod(t, e.c.Client, "default", pod.Name, 90*time.Second, "Running", func(p *corev1.Pod) bool {
		return p.Status.Phase == corev1.PodRunning && len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].ContainerID != ""
	})
	id := strings.TrimPrefix(running.Status.ContainerStatuses[0].ContainerID, "containerd://")
	st, err := e.rt.RuntimeClient.ContainerStatus(context.Background(), &criv1.ContainerStatusRequest{ContainerId: id, Verbose: true})
	if err != nil {
		t.Fatal(err)
	}
	var info struct {
		Pid int `json:"pid"`
	}
	if err := json.Unmarshal([]byte(st.Info["info"]), &info); err != nil || info.Pid == 0 {
		t.Fatalf("container %s's pid: %v (info %q)", id, err, st.Info["info"])
	}
	cgroups, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", info.Pid))
	if err != nil {
		t.Fatal(err)
	}
	var dir string
	for _, line := range strings.Split(string(cgroups), "\n") {
		if f := strings.SplitN(line, ":", 3); len(f) == 3 && f[1] == "memory" {
			dir = filepath.Join("/sys/fs/cgroup/memory", f[2])
		}
	}
	if dir == "" {
		t.Fatalf("no memory cgroup (v1) in %s", cgroups)
	}
	poll.Until(t, 30*time.Second, "the written pages charged to the container as shmem", func() error {
		stat, err := os.ReadFile(filepath.Join(dir, "memory.stat"))
		if err != nil {
			return err
		}
		for _, line := range strings.Split(string(stat), "\n") {
			if f := strings.Fields(line); len(f) == 2 && f[0] == "shmem" {
				if n, _ := strconv.ParseInt(f[1], 10, 64); n < size {
					return fmt.Errorf("%s: shmem %d, want at least %d", dir, n, size)
				}
				return nil
			}
		}
		return fmt.Errorf("%s has no shmem", dir)
	})
	e.deletePod(t, pod)
}
