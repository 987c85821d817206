package kubelet

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cairn-os/cairn/agent/kubelet/pods"
	"github.com/cairn-os/cairn/test/poll"
)

// TestPodsSurvive wants the node's pods to outlive the agent, the API
// server and containerd going away: the agent adopts running pods after
// its restart instead of making them again, keeps running pods while the
// API server is away and reports what happened meanwhile once it is back,
// and waits for containerd to return.
func TestPodsSurvive(t *testing.T) {
	e, cfg := newPodEnv(t, "survive-1")
	// Resyncs far shorter than a crash loop's back-off: while the API
	// server is away, failed status writes grow the pod's error backoff,
	// which must not postpone the container's restart (it once did).
	cfg.PodResync = time.Second
	a := start(t, cfg)
	grace := int64(1)
	pod := e.createPod(t, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "survivor", Namespace: "default"},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{Name: "probee", Image: e.probee, ImagePullPolicy: corev1.PullIfNotPresent,
				// Read from the Node: the restart while the API server
				// is away takes it from the watched Node.
				Env: []corev1.EnvVar{{Name: "HOST_IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.hostIP"}}}},
			}},
		},
	})
	running := waitPod(t, e.c.Client, "default", "survivor", 60*time.Second, "Running", func(p *corev1.Pod) bool {
		return p.Status.Phase == corev1.PodRunning && len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].Ready
	})
	sandbox := e.onlySandbox(t, pod)
	podIP := running.Status.PodIP

	// The phases run in order on the one agent, without subtests: the
	// agent started anew belongs to the whole test.
	var orphanLogs string
	t.Log("phase: the agent restarts and adopts the running pod")
	{
		a.stop()
		// Volumes left by a pod deleted while the agent was away.
		orphan := filepath.Join(cfg.Dir, "pods", "0e4f0000-dead-4bad-8000-000000000000", "volumes", "kubernetes.io~empty-dir", "x")
		if err := os.MkdirAll(orphan, 0o755); err != nil {
			t.Fatal(err)
		}
		// and its logs, which go a minute after housekeeping found them.
		orphanLogs = filepath.Join(cfg.Pods.LogRoot, "default_gone_0e4f0000-dead-4bad-8000-000000000000", "c", "0.log")
		if err := os.MkdirAll(filepath.Dir(orphanLogs), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(orphanLogs, []byte("2026-11-29T16:00:00Z stdout F bye\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		restarted := time.Now()
		start(t, cfg)
		e.waitLeaseRenewedAfter(t, restarted)
		// The new agent synced the pod when it started; give it a
		// resync too to do anything wrong.
		e.waitWakeups(t, wakeResync, 1)
		poll.Until(t, 10*time.Second, "orphan volumes removed by housekeeping", func() error {
			if _, err := os.Stat(orphan); !os.IsNotExist(err) {
				return fmt.Errorf("%s still there (%v)", orphan, err)
			}
			return nil
		})
		if got := e.onlySandbox(t, pod); got != sandbox {
			t.Fatalf("sandbox %s after the agent's restart, want the running %s kept", got, sandbox)
		}
		p := e.getPod(t, "survivor")
		cs := p.Status.ContainerStatuses[0]
		if cs.ContainerID != running.Status.ContainerStatuses[0].ContainerID || cs.RestartCount != 0 || !cs.Ready {
			t.Errorf("container %s restarts %d ready %v, want %s kept, no restart, ready",
				cs.ContainerID, cs.RestartCount, cs.Ready, running.Status.ContainerStatuses[0].ContainerID)
		}
		// A crash is handled by the new agent in the same sandbox.
		e.crash(t, cs.ContainerID)
		p = waitPod(t, e.c.Client, "default", "survivor", 60*time.Second, "restarted", func(p *corev1.Pod) bool {
			return p.Status.ContainerStatuses[0].RestartCount == 1 && p.Status.ContainerStatuses[0].Ready
		})
		if p.Status.PodIP != podIP || e.onlySandbox(t, pod) != sandbox {
			t.Errorf("pod IP %s, want %s in the same sandbox", p.Status.PodIP, podIP)
		}
	}

	t.Log("phase: containerd restarts")
	{
		before := e.getPod(t, "survivor").Status.ContainerStatuses[0]
		e.rt.Restart()
		if id, _ := e.runningContainer(t, pod); "containerd://"+id != before.ContainerID {
			t.Errorf("running container %s after containerd's restart, want %s still", id, before.ContainerID)
		}
		// The agent reconnects: a new pod runs, and a crash of the old
		// one's container is seen and handled.
		fresh := e.createPod(t, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "after-restart", Namespace: "default"},
			Spec: corev1.PodSpec{
				TerminationGracePeriodSeconds: &grace,
				Containers:                    []corev1.Container{{Name: "probee", Image: e.probee, ImagePullPolicy: corev1.PullIfNotPresent}},
			},
		})
		waitPod(t, e.c.Client, "default", "after-restart", 60*time.Second, "Running", func(p *corev1.Pod) bool {
			return p.Status.Phase == corev1.PodRunning
		})
		e.crash(t, before.ContainerID)
		waitPod(t, e.c.Client, "default", "survivor", 60*time.Second, "restarted", func(p *corev1.Pod) bool {
			return p.Status.ContainerStatuses[0].RestartCount == before.RestartCount+1
		})
		e.deletePod(t, fresh)
	}
	t.Log("phase: the API server goes away and comes back")
	{
		before := e.getPod(t, "survivor").Status.ContainerStatuses[0]
		e.c.StopAPIServer()
		// Without the API server the node still restarts what crashes.
		e.crash(t, before.ContainerID)
		poll.Until(t, 60*time.Second, "container restarted while the API server is away", func() error {
			id, attempt := e.runningContainer(t, pod)
			if id == "" || "containerd://"+id == before.ContainerID {
				return fmt.Errorf("no new running container yet (attempt %d)", attempt)
			}
			return nil
		})
		e.c.StartAPIServer()
		p := waitPod(t, e.c.Client, "default", "survivor", 60*time.Second, "status resynced", func(p *corev1.Pod) bool {
			cs := p.Status.ContainerStatuses[0]
			return cs.RestartCount == before.RestartCount+1 && cs.Ready
		})
		if p.Status.PodIP != podIP || e.onlySandbox(t, pod) != sandbox {
			t.Errorf("pod IP %s, want %s in the same sandbox", p.Status.PodIP, podIP)
		}
		// New pods are seen as soon as the API server is back: the pod
		// watch waits for it rather than backing off (watch.go).
		created := time.Now()
		fresh := e.createPod(t, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "after-outage", Namespace: "default"},
			Spec: corev1.PodSpec{
				TerminationGracePeriodSeconds: &grace,
				Containers:                    []corev1.Container{{Name: "probee", Image: e.probee, ImagePullPolicy: corev1.PullIfNotPresent}},
			},
		})
		waitPod(t, e.c.Client, "default", "after-outage", 30*time.Second, "Running", func(p *corev1.Pod) bool {
			return p.Status.Phase == corev1.PodRunning
		})
		t.Logf("a pod created after the outage Running %v after Create", time.Since(created).Round(time.Millisecond))
		e.deletePod(t, fresh)
	}

	e.deletePod(t, pod)
	poll.Until(t, 2*time.Minute, "logs of a pod deleted while the agent was away removed", func() error {
		if _, err := os.Stat(filepath.Dir(filepath.Dir(orphanLogs))); !os.IsNotExist(err) {
			return fmt.Errorf("%s still there (%v)", orphanLogs, err)
		}
		return nil
	})
}

func (e *podEnv) getPod(t *testing.T, name string) *corev1.Pod {
	t.Helper()
	p, err := e.c.Client.CoreV1().Pods("default").Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// onlySandbox is the ID of the pod's one sandbox in the runtime.
func (e *podEnv) onlySandbox(t *testing.T, pod *corev1.Pod) string {
	t.Helper()
	resp, err := e.rt.RuntimeClient.ListPodSandbox(context.Background(), &criv1.ListPodSandboxRequest{
		Filter: &criv1.PodSandboxFilter{LabelSelector: map[string]string{pods.LabelPodUID: string(pod.UID)}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Items) != 1 {
		t.Fatalf("%d sandboxes of pod %s, want 1", len(resp.Items), pod.Name)
	}
	return resp.Items[0].Id
}

// runningContainer is the ID and attempt of the pod's running container,
// if any.
func (e *podEnv) runningContainer(t *testing.T, pod *corev1.Pod) (string, uint32) {
	t.Helper()
	resp, err := e.rt.RuntimeClient.ListContainers(context.Background(), &criv1.ListContainersRequest{
		Filter: &criv1.ContainerFilter{
			LabelSelector: map[string]string{pods.LabelPodUID: string(pod.UID)},
			State:         &criv1.ContainerStateValue{State: criv1.ContainerState_CONTAINER_RUNNING},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Containers) == 0 {
		return "", 0
	}
	return resp.Containers[0].Id, resp.Containers[0].GetMetadata().GetAttempt()
}

// crash stops a container behind the agent's back, as if it had died.
func (e *podEnv) crash(t *testing.T, containerID string) {
	t.Helper()
	id := strings.TrimPrefix(containerID, "containerd://")
	if _, err := e.rt.RuntimeClient.StopContainer(context.Background(), &criv1.StopContainerRequest{ContainerId: id, Timeout: 1}); err != nil {
		t.Fatalf("stop container %s: %v", id, err)
	}
}

// waitLeaseRenewedAfter waits until the node's Lease was renewed after t0.
func (e *podEnv) waitLeaseRenewedAfter(t *testing.T, t0 time.Time) {
	t.Helper()
	poll.Until(t, 30*time.Second, "Lease renewed by the new agent", func() error {
		l, err := e.c.Client.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(context.Background(), e.node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if l.Spec.RenewTime == nil || l.Spec.RenewTime.Time.Before(t0) {
			return fmt.Errorf("renewed %v, before the restart at %v", l.Spec.RenewTime, t0)
		}
		return nil
	})
}
