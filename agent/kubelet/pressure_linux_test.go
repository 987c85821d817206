package kubelet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/utils/ptr"

	"github.com/cairn-os/cairn/agent/kubelet/cri"
	"github.com/cairn-os/cairn/agent/node"
	"github.com/cairn-os/cairn/agent/node/host"
	"github.com/cairn-os/cairn/test/kube"
	"github.com/cairn-os/cairn/test/poll"
)

// TestMemoryPressureEviction runs, on a node of a real control plane
// with a real containerd, a BestEffort pod that holds 1 GiB and a
// Guaranteed pod, with a memory.available threshold pressureMargin under
// what the host had free: the hog puts the node under pressure and is evicted
// as the kubelet evicts (Failed, Evicted, the node's low resource and the
// container's use), which relieves it; the Guaranteed pod runs on. Then a
// critical pod (system-node-critical) hogs 1 GiB: it is never evicted,
// and the Guaranteed pod goes instead.
func TestMemoryPressureEviction(t *testing.T) {
	e := startPressureNode(t, time.Second, false)
	guaranteed, hog := e.runHog(t, nil, 1)
	got := waitPod(t, e.c.Client, "default", hog.Name, 2*time.Minute, "evicted", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodFailed })
	if got.Status.Reason != "Evicted" ||
		!strings.HasPrefix(got.Status.Message, "The node was low on resource: memory. Threshold quantity: ") ||
		!strings.Contains(got.Status.Message, "Container hog was using ") {
		t.Errorf("hog: reason %q, message %q; want Evicted, the node low on memory, the container's use", got.Status.Reason, got.Status.Message)
	}
	// The pressure is gone with the hog: a few more looks evict nothing.
	time.Sleep(5 * time.Second)
	e.checkRunning(t, guaranteed)

	// A critical pod that hogs memory is never evicted: the Guaranteed
	// pod, the only other, goes in its stead, as with the kubelet.
	critical := e.createPod(t, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "critical-hog", Namespace: "kube-system"},
		Spec: corev1.PodSpec{PriorityClassName: "system-node-critical", TerminationGracePeriodSeconds: ptr.To[int64](1),
			Containers: []corev1.Container{{
				Name: "hog", Image: e.probee, ImagePullPolicy: corev1.PullIfNotPresent,
				Env: []corev1.EnvVar{{Name: "HOLD_BYTES", Value: "1073741824"}},
			}}},
	})
	waitPod(t, e.c.Client, "default", guaranteed.Name, 2*time.Minute, "the Guaranteed pod evicted in the critical pod's stead", func(p *corev1.Pod) bool {
		return p.Status.Phase == corev1.PodFailed
	})
	time.Sleep(5 * time.Second) // a few more looks: the pressure stays
	e.checkRunning(t, critical)
}

// checkRunning fails t unless pod is Running now.
func (e *podEnv) checkRunning(t *testing.T, pod *corev1.Pod) {
	t.Helper()
	p, err := e.c.Client.CoreV1().Pods(pod.Namespace).Get(context.Background(), pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Status.Phase != corev1.PodRunning {
		t.Errorf("%s: phase %s (%s %s), want Running", p.Name, p.Status.Phase, p.Status.Reason, p.Status.Message)
	}
}

// TestStaticPodNotEvicted runs a static pod that holds 1 GiB on a node
// whose memory.available threshold is pressureMargin under what the host
// had free: the node is under memory pressure, and the static pod, which the
// kubelet never evicts, runs on in the same container.
func TestStaticPodNotEvicted(t *testing.T) {
	e, cfg := newPodEnv(t, "static-hog-1")
	dir := filepath.Join(t.TempDir(), "static-pods")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	cfg.StaticPodDir = dir
	m, err := host.ReadMemory()
	if err != nil {
		t.Fatal(err)
	}
	cfg.Thresholds.MemoryAvailable = m.Available - pressureMargin
	cfg.join.Thresholds.MemoryAvailable = cfg.Thresholds.MemoryAvailable
	writeManifest(t, dir, "hog.yaml", &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: "hog"},
		Spec: corev1.PodSpec{
			HostNetwork:                   true,
			TerminationGracePeriodSeconds: ptr.To[int64](1),
			Containers: []corev1.Container{{Name: "hog", Image: e.probee, ImagePullPolicy: corev1.PullIfNotPresent,
				Env: []corev1.EnvVar{{Name: "HOLD_BYTES", Value: "1073741824"}}}},
		},
	})
	startStatic(t, cfg)
	ctr, _ := e.staticContainer(t, "hog-static-hog-1", e.probee, 2*time.Minute)
	poll.Until(t, time.Minute, "the node under memory pressure", func() error {
		n, err := e.c.Client.CoreV1().Nodes().Get(context.Background(), e.node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeMemoryPressure && c.Status == corev1.ConditionTrue {
				return nil
			}
		}
		return errors.New("no MemoryPressure")
	})
	time.Sleep(3 * evictionInterval) // looks that find the pressure
	again, _ := e.staticContainer(t, "hog-static-hog-1", e.probee, time.Second)
	if again.Id != ctr.Id || again.State != criv1.ContainerState_CONTAINER_RUNNING {
		t.Errorf("static hog: container %s %v, want %s still running", again.Id, again.State, ctr.Id)
	}
}

// TestSoftEviction evicts, past a soft memory.available threshold crossed
// for its grace period, the BestEffort pod that holds 1 GiB, giving it the
// soft eviction's 1 s to stop though it ignores SIGTERM and would have
// 60 s.
func TestSoftEviction(t *testing.T) {
	e := startPressureNode(t, time.Second, true)
	_, hog := e.runHog(t, []corev1.EnvVar{{Name: "IGNORE_TERM", Value: "1"}}, 60)
	got := waitPod(t, e.c.Client, "default", hog.Name, 40*time.Second, "evicted within the soft eviction's grace", func(p *corev1.Pod) bool {
		return p.Status.Phase == corev1.PodFailed
	})
	if got.Status.Reason != "Evicted" || !strings.HasPrefix(got.Status.Message, "The node was low on resource: memory.") {
		t.Errorf("hog: reason %q, message %q; want Evicted, the node low on memory", got.Status.Reason, got.Status.Message)
	}
}

// TestImagefsPressure runs a node whose imagefs.available threshold is
// all of the images' filesystem, as real containerd names it: the Node
// reports DiskPressure, saying it is the images' filesystem.
func TestImagefsPressure(t *testing.T) {
	e, cfg := newPodEnvWith(t, "imagefs-1", kube.Options{})
	cfg.join.ImageFS = func(ctx context.Context) (string, error) { return cri.ImageFilesystem(ctx, e.rt.ImageClient) }
	cfg.join.Thresholds.ImagefsAvailable = 100
	startWith(t, cfg)
	const want = "free space of the images' filesystem is below 100 %"
	poll.Until(t, time.Minute, "DiskPressure from the images' filesystem", func() error {
		n, err := e.c.Client.CoreV1().Nodes().Get(context.Background(), e.node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeDiskPressure {
				if c.Status != corev1.ConditionTrue || c.Message != want {
					return fmt.Errorf("DiskPressure %s %q, want True %q", c.Status, c.Message, want)
				}
				return nil
			}
		}
		return errors.New("no DiskPressure condition")
	})
}

// BenchmarkEviction prints how long the node takes to evict a pod that
// crosses the memory.available threshold, from the moment its container
// runs (and holds 1 GiB) to the pod Failed, with the node looking as often
// as it does (evictionInterval).
func BenchmarkEviction(b *testing.B) {
	e := startPressureNode(b, 0, false)
	for b.Loop() {
		_, hog := e.runHog(b, nil, 1)
		running := waitPod(b, e.c.Client, "default", hog.Name, time.Minute, "Running", func(p *corev1.Pod) bool {
			return p.Status.Phase == corev1.PodRunning || p.Status.Phase == corev1.PodFailed
		})
		var started time.Time
		for _, cs := range running.Status.ContainerStatuses {
			if cs.State.Running != nil {
				started = cs.State.Running.StartedAt.Time
			}
		}
		waitPod(b, e.c.Client, "default", hog.Name, 2*time.Minute, "evicted", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodFailed })
		took := time.Since(started)
		b.Logf("memory.available crossed → pod Failed (Evicted): %v (the node looks every %v)", took.Round(10*time.Millisecond), evictionInterval)
		b.ReportMetric(took.Seconds(), "s-to-evicted")
	}
}

// pressureNode is a node whose memory.available threshold, hard or soft,
// is pressureMargin under what the host had free when it started.
type pressureNode struct{ *podEnv }

// pressureMargin is how far under the host's free memory the tests put
// the memory.available threshold: far enough that other tests running
// beside them (a test binary linking takes hundreds of MiB) do not cross
// it, near enough that a pod holding 1 GiB does.
const pressureMargin = 600 << 20

// startPressureNode starts it, looking for pressure every interval (0:
// the node's default). A soft threshold has a grace period of 3 s and
// gives an evicted pod at most 1 s to stop.
func startPressureNode(tb testing.TB, interval time.Duration, soft bool) pressureNode {
	e, cfg := newPodEnvWith(tb, "pressure-1", kube.Options{})
	m, err := host.ReadMemory()
	if err != nil {
		tb.Fatal(err)
	}
	if soft {
		cfg.Soft = SoftEviction{Thresholds: node.Thresholds{MemoryAvailable: m.Available - pressureMargin},
			GracePeriods: map[string]time.Duration{"memory.available": 3 * time.Second}, MaxPodGracePeriod: time.Second}
	} else {
		cfg.Thresholds.MemoryAvailable = m.Available - pressureMargin
	}
	cfg.evictionInterval = interval
	if _, bench := tb.(*testing.B); bench {
		cfg.Log = slog.New(slog.DiscardHandler) // a benchmark prints all it logs
	}
	startWith(tb, cfg)
	e.testNodeReady(tb)
	return pressureNode{e}
}

// runHog runs a Guaranteed pod, waits for it to run, then creates a
// BestEffort pod that holds 1 GiB, with env and a termination grace
// period of hogGrace seconds.
func (e pressureNode) runHog(tb testing.TB, env []corev1.EnvVar, hogGrace int64) (guaranteed, hog *corev1.Pod) {
	grace := int64(1)
	suffix := fmt.Sprint(time.Now().UnixNano())
	guaranteed = e.createPod(tb, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "guaranteed-" + suffix, Namespace: "default"},
		Spec: corev1.PodSpec{TerminationGracePeriodSeconds: &grace, Containers: []corev1.Container{{
			Name: "probee", Image: e.probee, ImagePullPolicy: corev1.PullIfNotPresent,
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
				corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("64Mi"),
			}},
		}}},
	})
	waitPod(tb, e.c.Client, "default", guaranteed.Name, 60*time.Second, "Running", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
	hog = e.createPod(tb, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "hog-" + suffix, Namespace: "default"},
		Spec: corev1.PodSpec{TerminationGracePeriodSeconds: &hogGrace, Containers: []corev1.Container{{
			Name: "hog", Image: e.probee, ImagePullPolicy: corev1.PullIfNotPresent,
			Env: append([]corev1.EnvVar{{Name: "HOLD_BYTES", Value: "1073741824"}}, env...),
		}}},
	})
	return guaranteed, hog
}
