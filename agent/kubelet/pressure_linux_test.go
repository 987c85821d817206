package kubelet

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cairn-os/cairn/agent/node/host"
)

// TestMemoryPressureEviction runs, on a node of a real control plane
// with a real containerd, a BestEffort pod that holds 1 GiB and a
// Guaranteed pod, with a memory.available threshold 300 MiB under what
// the host had free: the hog puts the node under pressure and is evicted
// as the kubelet evicts (Failed, Evicted, the node's low resource and the
// container's use), which relieves it; the Guaranteed pod runs on.
func TestMemoryPressureEviction(t *testing.T) {
	e, cfg := newPodEnv(t, "pressure-1")
	m, err := host.ReadMemory()
	if err != nil {
		t.Fatal(err)
	}
	cfg.Thresholds.MemoryAvailable = m.Available - 300<<20
	cfg.evictionInterval = time.Second
	start(t, cfg)
	e.testNodeReady(t)
	grace := int64(1)
	guaranteed := e.createPod(t, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "guaranteed", Namespace: "default"},
		Spec: corev1.PodSpec{TerminationGracePeriodSeconds: &grace, Containers: []corev1.Container{{
			Name: "probee", Image: e.probee, ImagePullPolicy: corev1.PullIfNotPresent,
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
				corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("64Mi"),
			}},
		}}},
	})
	waitPod(t, e.c.Client, "default", guaranteed.Name, 60*time.Second, "Running", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
	hog := e.createPod(t, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "hog", Namespace: "default"},
		Spec: corev1.PodSpec{TerminationGracePeriodSeconds: &grace, Containers: []corev1.Container{{
			Name: "hog", Image: e.probee, ImagePullPolicy: corev1.PullIfNotPresent,
			Env: []corev1.EnvVar{{Name: "HOLD_BYTES", Value: "1073741824"}},
		}}},
	})
	got := waitPod(t, e.c.Client, "default", hog.Name, 2*time.Minute, "evicted", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodFailed })
	if got.Status.Reason != "Evicted" ||
		!strings.HasPrefix(got.Status.Message, "The node was low on resource: memory. Threshold quantity: ") ||
		!strings.Contains(got.Status.Message, "Container hog was using ") {
		t.Errorf("hog: reason %q, message %q; want Evicted, the node low on memory, the container's use", got.Status.Reason, got.Status.Message)
	}
	// The pressure is gone with the hog: a few more looks evict nothing.
	time.Sleep(5 * time.Second)
	g, err := e.c.Client.CoreV1().Pods("default").Get(context.Background(), guaranteed.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if g.Status.Phase != corev1.PodRunning {
		t.Errorf("guaranteed: phase %s (%s %s), want Running", g.Status.Phase, g.Status.Reason, g.Status.Message)
	}
}
