package kubelet

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestPodResizeProof proves in-place resize on a node of a real control
// plane running its pods on a real containerd: a running pod resized
// through the resize subresource has its new limits in the cgroups its
// containers read, the same container for a resource resized without a
// restart, a new one for the container whose resizePolicy restarts it;
// its status reports the resources applied and admitted, and no resize
// condition once done; a resize that does not fit beside the node's other
// pods is PodResizePending, Deferred, and changes nothing until they are
// gone. (One that no node could hold the API server refuses itself.)
func TestPodResizeProof(t *testing.T) {
	e, cfg := newPodEnv(t, "resize-1")
	start(t, cfg)
	e.testNodeReady(t)
	image := e.busyboxImage(t)

	res := func(cpuReq, cpuLim, memReq, memLim string) corev1.ResourceRequirements {
		return corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpuReq), corev1.ResourceMemory: resource.MustParse(memReq)},
			Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpuLim), corev1.ResourceMemory: resource.MustParse(memLim)},
		}
	}
	ctr := func(name string, r corev1.ResourceRequirements, memPolicy corev1.ResourceResizeRestartPolicy) corev1.Container {
		return corev1.Container{Name: name, Image: image, ImagePullPolicy: corev1.PullIfNotPresent,
			Command:   []string{"/bin/busybox", "sleep", "3600"},
			Resources: r,
			ResizePolicy: []corev1.ContainerResizePolicy{
				{ResourceName: corev1.ResourceCPU, RestartPolicy: corev1.NotRequired},
				{ResourceName: corev1.ResourceMemory, RestartPolicy: memPolicy},
			}}
	}
	grace := int64(1)
	pod := e.createPod(t, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "resize", Namespace: "default"},
		Spec: corev1.PodSpec{TerminationGracePeriodSeconds: &grace, Containers: []corev1.Container{
			ctr("live", res("100m", "200m", "32Mi", "64Mi"), corev1.NotRequired),
			ctr("restarts", res("100m", "200m", "32Mi", "64Mi"), corev1.RestartContainer),
		}},
	})
	defer e.deletePod(t, pod)
	ready := func(p *corev1.Pod) bool {
		return running(p) && p.Status.ObservedGeneration == p.Generation && podCondition(p, corev1.PodReady) == corev1.ConditionTrue &&
			podCondition(p, corev1.PodResizePending) == "" && podCondition(p, corev1.PodResizeInProgress) == ""
	}
	before := waitPod(t, e.c.Client, pod.Namespace, pod.Name, 60*time.Second, "running and ready", ready)
	e.wantResources(t, before)
	live, restarts := containerStatusOf(before, "live"), containerStatusOf(before, "restarts")
	e.wantCgroup(t, live.ContainerID, cgroupCPUQuota, "20000")
	e.wantCgroup(t, live.ContainerID, cgroupMemoryLimit, "67108864")
	weight := e.cgroup(t, live.ContainerID, cgroupCPUWeight)

	resize := func(change func(*corev1.Pod)) {
		t.Helper()
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			p, err := e.c.Client.CoreV1().Pods(pod.Namespace).Get(context.Background(), pod.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			change(p)
			_, err = e.c.Client.CoreV1().Pods(pod.Namespace).UpdateResize(context.Background(), pod.Name, p, metav1.UpdateOptions{})
			return err
		})
		if err != nil {
			t.Fatalf("resize Pod %s: %v", pod.Name, err)
		}
	}
	began := time.Now()
	resize(func(p *corev1.Pod) {
		p.Spec.Containers[0].Resources = res("150m", "300m", "48Mi", "96Mi")
		p.Spec.Containers[1].Resources = res("100m", "200m", "32Mi", "128Mi")
	})
	after := waitPod(t, e.c.Client, pod.Namespace, pod.Name, 60*time.Second, "resized, running and ready", func(p *corev1.Pod) bool {
		return ready(p) && apiequality.Semantic.DeepEqual(containerStatusOf(p, "live").Resources, &p.Spec.Containers[0].Resources) &&
			apiequality.Semantic.DeepEqual(containerStatusOf(p, "restarts").Resources, &p.Spec.Containers[1].Resources)
	})
	t.Logf("resize applied and reported in %v", time.Since(began))
	e.wantResources(t, after)
	liveAfter, restartsAfter := containerStatusOf(after, "live"), containerStatusOf(after, "restarts")
	if liveAfter.ContainerID != live.ContainerID || liveAfter.RestartCount != live.RestartCount {
		t.Errorf("live is %s, restarted %d times; want %s still, not restarted", liveAfter.ContainerID, liveAfter.RestartCount, live.ContainerID)
	}
	e.wantCgroup(t, live.ContainerID, cgroupCPUQuota, "30000")
	e.wantCgroup(t, live.ContainerID, cgroupMemoryLimit, "100663296")
	if w := e.cgroup(t, live.ContainerID, cgroupCPUWeight); w == weight {
		t.Errorf("cpu.weight of live stayed %s after its CPU request grew", w)
	}
	if restartsAfter.ContainerID == restarts.ContainerID || restartsAfter.RestartCount != restarts.RestartCount+1 {
		t.Errorf("restarts is %s, restarted %d times; want a new container, restarted once", restartsAfter.ContainerID, restartsAfter.RestartCount)
	}
	e.wantCgroup(t, restartsAfter.ContainerID, cgroupMemoryLimit, "134217728")

	// Beside a pod that takes most of the node's CPU, a larger request
	// does not fit: the resize waits, Deferred, and the containers keep
	// what they have, until that pod is gone.
	node, err := e.c.Client.CoreV1().Nodes().Get(context.Background(), e.node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	allocatable := node.Status.Allocatable.Cpu().MilliValue()
	filler := e.helloPod("filler")
	filler.Spec.Containers[0].Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: *resource.NewMilliQuantity(allocatable-400, resource.DecimalSI)}
	filler = e.createPod(t, filler)
	waitPod(t, e.c.Client, filler.Namespace, filler.Name, 60*time.Second, "filler running", running)
	resize(func(p *corev1.Pod) { p.Spec.Containers[0].Resources = res("500m", "500m", "48Mi", "96Mi") })
	pending := waitPod(t, e.c.Client, pod.Namespace, pod.Name, 60*time.Second, "PodResizePending", func(p *corev1.Pod) bool {
		return p.Status.ObservedGeneration == p.Generation && podCondition(p, corev1.PodResizePending) == corev1.ConditionTrue
	})
	i := slices.IndexFunc(pending.Status.Conditions, func(c corev1.PodCondition) bool { return c.Type == corev1.PodResizePending })
	want := fmt.Sprintf("Node didn't have enough resource: cpu, requested: 600, used: %d, capacity: %d", allocatable-400, allocatable)
	if c := pending.Status.Conditions[i]; c.Reason != corev1.PodReasonDeferred || c.Message != want {
		t.Errorf("PodResizePending %s: %q, want Deferred: %q", c.Reason, c.Message, want)
	}
	if got := containerStatusOf(pending, "live"); !apiequality.Semantic.DeepEqual(got.Resources, liveAfter.Resources) ||
		!apiequality.Semantic.DeepEqual(got.AllocatedResources, liveAfter.AllocatedResources) {
		t.Errorf("live's status after a deferred resize: %v", cmp.Diff(liveAfter, got))
	}
	e.wantCgroup(t, live.ContainerID, cgroupCPUQuota, "30000")
	woke := e.wakeups(t)[string(wakeResize)]
	e.deletePod(t, filler)
	began = time.Now()
	waitPod(t, e.c.Client, pod.Namespace, pod.Name, 60*time.Second, "the deferred resize applied", func(p *corev1.Pod) bool {
		return ready(p) && apiequality.Semantic.DeepEqual(containerStatusOf(p, "live").Resources, &p.Spec.Containers[0].Resources)
	})
	t.Logf("deferred resize applied %v after the other pod was gone", time.Since(began))
	if n := e.wakeups(t)[string(wakeResize)] - woke; n < 1 {
		t.Errorf("%v wakeups for the deferred resize, want 1 or more", n)
	}
	e.wantCgroup(t, live.ContainerID, cgroupCPUQuota, "50000")
}

// wantResources checks that every container of the running pod p
// reports its spec's resources as applied and its requests as admitted.
func (e *podEnv) wantResources(t *testing.T, p *corev1.Pod) {
	t.Helper()
	for _, c := range p.Spec.Containers {
		cs := containerStatusOf(p, c.Name)
		if cs == nil || cs.Resources == nil || !apiequality.Semantic.DeepEqual(*cs.Resources, c.Resources) ||
			!apiequality.Semantic.DeepEqual(cs.AllocatedResources, c.Resources.Requests) {
			t.Errorf("container %s: status resources %v, allocated %v; want %v", c.Name, cs.Resources, cs.AllocatedResources, c.Resources)
		}
	}
}

// What the tests read of a container's cgroup: its CPU quota (of a
// 100 ms period), memory limit in bytes and CPU weight (shares on
// cgroup v1), in the files of cgroup v2 and of v1 (this host is v1).
type cgroupValue int

const (
	cgroupCPUQuota cgroupValue = iota
	cgroupMemoryLimit
	cgroupCPUWeight
)

// cgroup reads one value of the container's own cgroup, as the
// container sees it, from cgroup v2's files or else v1's.
func (e *podEnv) cgroup(t *testing.T, containerID string, v cgroupValue) string {
	t.Helper()
	id := strings.TrimPrefix(containerID, "containerd://")
	script := `if [ -e /sys/fs/cgroup/cgroup.controllers ]; then set -- cpu.max memory.max cpu.weight; ` +
		`else set -- cpu/cpu.cfs_quota_us memory/memory.limit_in_bytes cpu/cpu.shares; fi; ` +
		`cd /sys/fs/cgroup && /bin/busybox cat "$1" "$2" "$3"`
	resp, err := e.rt.RuntimeClient.ExecSync(context.Background(), &criv1.ExecSyncRequest{
		ContainerId: id, Cmd: []string{"/bin/busybox", "sh", "-c", script}, Timeout: 10,
	})
	if err != nil || resp.ExitCode != 0 {
		t.Fatalf("read the cgroup of %s: %v, exit %d: %s", id, err, resp.GetExitCode(), resp.GetStderr())
	}
	lines := strings.Split(strings.TrimSpace(string(resp.Stdout)), "\n")
	if len(lines) != 3 {
		t.Fatalf("the cgroup of %s reads %q, want 3 lines", id, resp.Stdout)
	}
	// cpu.max is "quota period".
	return strings.Fields(lines[v])[0]
}

func (e *podEnv) wantCgroup(t *testing.T, containerID string, v cgroupValue, want string) {
	t.Helper()
	if got := e.cgroup(t, containerID, v); got != want {
		t.Errorf("cgroup value %d of %s = %q, want %q", v, containerID, got, want)
	}
}
