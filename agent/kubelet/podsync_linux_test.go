package kubelet

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cairn-os/cairn/agent/kubelet/cri"
	"github.com/cairn-os/cairn/agent/kubelet/pods"
	"github.com/cairn-os/cairn/test/kube"
	"github.com/cairn-os/cairn/test/poll"
	"github.com/cairn-os/cairn/test/registry"
	"github.com/cairn-os/cairn/test/runtime"
)

// podEnv is a node that joined a real control plane and runs its pods on
// a real containerd, with a registry holding the test images.
type podEnv struct {
	c           *kube.Cluster
	rt          *runtime.Runtime
	node        string
	hello, echo string // image references
	probee      string
	metrics     *prometheus.Registry // the node's
	reg         *registry.Registry   // for a test's own images
}

// TestPodSync runs Pods created through the API on a node of the real
// control plane with a real containerd.
func TestPodSync(t *testing.T) {
	e, cfg := newPodEnv(t, "pods-1")
	start(t, cfg)

	t.Run("node ready with the CRI's status", func(t *testing.T) { e.testNodeReady(t) })
	t.Run("pod runs and is deleted", func(t *testing.T) { e.testRunDelete(t) })
	t.Run("pod fails", func(t *testing.T) { e.testFails(t) })
	t.Run("container restarts", func(t *testing.T) { e.testRestarts(t) })
	t.Run("readiness probe", func(t *testing.T) { e.testReadinessProbe(t) })
	t.Run("liveness probe restarts", func(t *testing.T) { e.testLivenessProbe(t) })
	t.Run("liveness restarts under OnFailure", func(t *testing.T) { e.testLivenessOnFailure(t) })
	t.Run("lifecycle hooks", func(t *testing.T) { e.testHooks(t) })
	t.Run("failing postStart hook", func(t *testing.T) { e.testFailedPostStart(t) })
	t.Run("metrics", func(t *testing.T) { e.testMetrics(t) })
}

// newPodEnv starts a control plane, a containerd and a registry with the
// test images, and returns them with the config of a node called node
// that runs its pods there.
func newPodEnv(t *testing.T, node string) (*podEnv, testNode) {
	return newPodEnvWith(t, node, kube.Options{})
}

// newPodEnvWith is newPodEnv with a control plane of opts.
func newPodEnvWith(t testing.TB, node string, opts kube.Options) (*podEnv, testNode) {
	c := kube.Start(t, opts)
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
	if _, err := registry.BuildAndPush(ctx, reg, "./agent/kubelet/pods/testdata/echoexit", "cairn-test/echoexit:v1"); err != nil {
		t.Fatal(err)
	}
	if _, err := registry.BuildAndPush(ctx, reg, "./agent/kubelet/testdata/probee", "cairn-test/probee:v1"); err != nil {
		t.Fatal(err)
	}
	metrics := prometheus.NewRegistry()
	client, err := cri.New(rt.Socket, cri.WithMetrics(metrics))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })

	e := &podEnv{c: c, rt: rt, node: node, hello: reg.Addr + "/cairn-test/hello:v1", echo: reg.Addr + "/cairn-test/echoexit:v1",
		probee: reg.Addr + "/cairn-test/probee:v1", metrics: metrics, reg: reg}
	cfg := testConfig(t, c, e.node, t.TempDir())
	cfg.Metrics = metrics
	cfg.RuntimeInfo, cfg.RuntimeStatus = client, client
	cfg.Pods = &PodConfig{Runtime: client.Runtime, Images: client.Images, LogRoot: filepath.Join(t.TempDir(), "pods")}
	return e, cfg
}

func (e *podEnv) testNodeReady(t testing.TB) {
	poll.Until(t, 60*time.Second, "Node Ready", func() error {
		node, err := e.c.Client.CoreV1().Nodes().Get(context.Background(), e.node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if !strings.HasPrefix(node.Status.NodeInfo.ContainerRuntimeVersion, "containerd://") {
			return fmt.Errorf("containerRuntimeVersion %q, want containerd://…", node.Status.NodeInfo.ContainerRuntimeVersion)
		}
		for _, c := range node.Status.Conditions {
			if c.Type == corev1.NodeReady {
				if c.Status != corev1.ConditionTrue {
					return fmt.Errorf("Ready = %s: %s %s", c.Status, c.Reason, c.Message)
				}
				return nil
			}
		}
		return fmt.Errorf("no Ready condition")
	})
}

// createPod creates pod on the node, retrying while the namespace's
// default ServiceAccount is not yet made.
func (e *podEnv) createPod(t testing.TB, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	pod.Spec.NodeName = e.node
	pod.Spec.AutomountServiceAccountToken = new(bool)
	var got *corev1.Pod
	poll.Until(t, 30*time.Second, "create Pod "+pod.Name, func() (err error) {
		got, err = e.c.Client.CoreV1().Pods(pod.Namespace).Create(context.Background(), pod, metav1.CreateOptions{})
		return err
	})
	return got
}

// waitPod watches the Pod until ok accepts it and returns it.
func waitPod(t testing.TB, cs kubernetes.Interface, ns, name string, timeout time.Duration, what string, ok func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var last *corev1.Pod
	for ctx.Err() == nil {
		p, err := cs.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("get Pod %s: %v", name, err)
		}
		last = p
		if ok(p) {
			return p
		}
		w, err := cs.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{
			FieldSelector:   fields.OneTermEqualSelector("metadata.name", name).String(),
			ResourceVersion: p.ResourceVersion,
		})
		if err != nil {
			continue
		}
		for ev := range w.ResultChan() {
			if p, isPod := ev.Object.(*corev1.Pod); isPod && ev.Type != watch.Deleted {
				last = p
				if ok(p) {
					w.Stop()
					return p
				}
			}
		}
		w.Stop()
	}
	t.Fatalf("Pod %s not %s within %v; last status: %+v", name, what, timeout, last.Status)
	return nil
}

// waitWakeups waits until the pods' workers woke n more times by source
// (pod_worker_wakeups_total), which proves they looked again.
func (e *podEnv) waitWakeups(t *testing.T, source wakeSource, n float64) {
	t.Helper()
	e.waitCount(t, "cairn_kubelet_pod_worker_wakeups_total", "source", string(source), n)
}

// waitCount waits until the node's counter called name, for value of its
// label, grew by n.
func (e *podEnv) waitCount(t *testing.T, name, label, value string, n float64) {
	t.Helper()
	before := e.counts(t, name, label)[value]
	poll.Until(t, 30*time.Second, fmt.Sprintf("%v more %s{%s=%q}", n, name, label, value), func() error {
		if got := e.counts(t, name, label)[value] - before; got < n {
			return fmt.Errorf("%v so far", got)
		}
		return nil
	})
}

func (e *podEnv) testRunDelete(t *testing.T) {
	ctx := context.Background()
	grace := int64(5)
	created := time.Now()
	pod := e.createPod(t, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "hello", Namespace: "default"},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{
				Name: "hello", Image: e.hello, ImagePullPolicy: corev1.PullIfNotPresent, Args: []string{"a", "b"},
			}},
		},
	})
	running := waitPod(t, e.c.Client, "default", "hello", 60*time.Second, "Running and Ready", func(p *corev1.Pod) bool {
		return p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "" &&
			len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].Ready
	})
	t.Logf("pod Running, Ready and with podIP %s %v after Create (seen through a watch)", running.Status.PodIP, time.Since(created).Round(time.Millisecond))

	st := running.Status
	if ip := net.ParseIP(st.PodIP); ip == nil || !e.rt.Subnet.Contains(ip) {
		t.Errorf("podIP = %q, want one of the runtime's %s", st.PodIP, e.rt.Subnet)
	}
	if len(st.PodIPs) != 1 || st.PodIPs[0].IP != st.PodIP {
		t.Errorf("podIPs = %v, want [%s]", st.PodIPs, st.PodIP)
	}
	if st.HostIP == "" || len(st.HostIPs) == 0 || st.StartTime == nil {
		t.Errorf("hostIP %q, hostIPs %v, startTime %v: want all set", st.HostIP, st.HostIPs, st.StartTime)
	}
	conds := map[corev1.PodConditionType]corev1.ConditionStatus{}
	for _, c := range st.Conditions {
		conds[c.Type] = c.Status
	}
	for _, ct := range []corev1.PodConditionType{corev1.PodReadyToStartContainers, corev1.PodInitialized, corev1.ContainersReady, corev1.PodReady} {
		if conds[ct] != corev1.ConditionTrue {
			t.Errorf("condition %s = %q, want True (conditions %v)", ct, conds[ct], st.Conditions)
		}
	}
	cs := st.ContainerStatuses[0]
	if cs.State.Running == nil || cs.Started == nil || !*cs.Started || cs.RestartCount != 0 || cs.ImageID == "" ||
		!strings.HasPrefix(cs.ContainerID, "containerd://") {
		t.Errorf("container status = %+v, want running, started, restartCount 0, imageID and containerd:// ID", cs)
	}

	// The container's output, from the CRI's log path.
	id := strings.TrimPrefix(cs.ContainerID, "containerd://")
	crs, err := e.rt.RuntimeClient.ContainerStatus(ctx, &criv1.ContainerStatusRequest{ContainerId: id})
	if err != nil {
		t.Fatalf("CRI status of the container: %v", err)
	}
	lines := runtime.LogLines(t, crs.Status.LogPath, 1)
	if len(lines) == 0 || !strings.HasPrefix(lines[0], "hello from cairn-test-image") || !strings.HasSuffix(lines[0], "args=a b") {
		t.Errorf("log %s = %q, want the hello line with args=a b", crs.Status.LogPath, lines)
	}

	// With nothing changing, the node writes no status: the Pod's
	// resourceVersion stays over a resync.
	rv := waitPod(t, e.c.Client, "default", "hello", 10*time.Second, "got", func(*corev1.Pod) bool { return true }).ResourceVersion
	e.waitWakeups(t, wakeResync, 1)
	if again := waitPod(t, e.c.Client, "default", "hello", 10*time.Second, "got", func(*corev1.Pod) bool { return true }); again.ResourceVersion != rv {
		t.Errorf("Pod written while nothing changed: resourceVersion %s → %s; status now %+v", rv, again.ResourceVersion, again.Status)
	}

	// Deleting it stops it within its grace period and takes the object
	// away.
	deleted := time.Now()
	if err := e.c.Client.CoreV1().Pods("default").Delete(ctx, "hello", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 30*time.Second, "Pod object gone", func() error {
		_, err := e.c.Client.CoreV1().Pods("default").Get(ctx, "hello", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("still there (err %v)", err)
	})
	t.Logf("Pod object gone %v after Delete", time.Since(deleted).Round(time.Millisecond))
	// The node deletes the object only once it killed the pod.
	e.wantNoSandboxes(t, string(pod.UID))
	if lines := runtime.LogLines(t, crs.Status.LogPath, 2); len(lines) < 2 || lines[len(lines)-1] != "bye" {
		t.Errorf("log after delete = %q, want it to end with bye (stopped with SIGTERM)", lines)
	}
}

// wantNoSandboxes waits up to 10 s for the runtime to have no sandbox
// and no container of the pod.
func (e *podEnv) wantNoSandboxes(t testing.TB, uid string) {
	t.Helper()
	ctx := context.Background()
	poll.Until(t, 10*time.Second, "pod's sandboxes and containers removed", func() error {
		sbs, err := e.rt.RuntimeClient.ListPodSandbox(ctx, &criv1.ListPodSandboxRequest{
			Filter: &criv1.PodSandboxFilter{LabelSelector: map[string]string{pods.LabelPodUID: uid}},
		})
		if err != nil {
			return err
		}
		ctrs, err := e.rt.RuntimeClient.ListContainers(ctx, &criv1.ListContainersRequest{
			Filter: &criv1.ContainerFilter{LabelSelector: map[string]string{pods.LabelPodUID: uid}},
		})
		if err != nil {
			return err
		}
		if len(sbs.Items) != 0 || len(ctrs.Containers) != 0 {
			return fmt.Errorf("runtime still has %d sandboxes and %d containers of pod %s", len(sbs.Items), len(ctrs.Containers), uid)
		}
		return nil
	})
}

func (e *podEnv) testFails(t *testing.T) {
	ctx := context.Background()
	created := time.Now()
	pod := e.createPod(t, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "fails", Namespace: "default"},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{
				Name: "fails", Image: e.echo, ImagePullPolicy: corev1.PullIfNotPresent,
				Env: []corev1.EnvVar{{Name: "EXIT_CODE", Value: "1"}},
			}},
		},
	})
	failed := waitPod(t, e.c.Client, "default", "fails", 60*time.Second, "Failed", func(p *corev1.Pod) bool {
		return p.Status.Phase == corev1.PodFailed
	})
	t.Logf("pod Failed %v after Create", time.Since(created).Round(time.Millisecond))
	if n := len(failed.Status.ContainerStatuses); n != 1 {
		t.Fatalf("%d container statuses, want 1", n)
	}
	cs := failed.Status.ContainerStatuses[0]
	if cs.State.Terminated == nil || cs.State.Terminated.ExitCode != 1 || cs.State.Terminated.Reason != "Error" || cs.Ready || cs.RestartCount != 0 {
		t.Errorf("container status = %+v, want terminated with exit code 1 (Error), not ready, no restart", cs)
	}
	for _, c := range failed.Status.Conditions {
		if c.Type == corev1.PodReady && (c.Status != corev1.ConditionFalse || c.Reason != "PodCompleted") {
			t.Errorf("Ready condition = %+v, want False, PodCompleted", c)
		}
	}
	// It stays Failed: not restarted when its worker wakes again.
	e.waitWakeups(t, wakeResync, 1)
	again, err := e.c.Client.CoreV1().Pods("default").Get(ctx, "fails", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if again.Status.Phase != corev1.PodFailed || again.Status.ContainerStatuses[0].RestartCount != 0 {
		t.Errorf("after a resync: phase %s, restarts %d, want still Failed without restarts", again.Status.Phase, again.Status.ContainerStatuses[0].RestartCount)
	}

	// The API server deletes an ended pod at once; the node then
	// removes its sandbox and containers.
	if err := e.c.Client.CoreV1().Pods("default").Delete(ctx, "fails", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 30*time.Second, "Pod object gone", func() error {
		_, err := e.c.Client.CoreV1().Pods("default").Get(ctx, "fails", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("still there (err %v)", err)
	})
	e.wantNoSandboxes(t, string(pod.UID))
}

// testRestarts wants a container that fails under restartPolicy
// OnFailure started again after the CrashLoopBackOff's first 10 s, with
// the failed run as its lastState.
func (e *podEnv) testRestarts(t *testing.T) {
	ctx := context.Background()
	grace := int64(1)
	pod := e.createPod(t, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "restarts", Namespace: "default"},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyOnFailure,
			TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{
				Name: "restarts", Image: e.echo, ImagePullPolicy: corev1.PullIfNotPresent,
				Env: []corev1.EnvVar{{Name: "EXIT_CODE", Value: "3"}},
			}},
		},
	})
	waitPod(t, e.c.Client, "default", "restarts", 30*time.Second, "in CrashLoopBackOff", func(p *corev1.Pod) bool {
		cs := p.Status.ContainerStatuses
		return len(cs) == 1 && cs[0].State.Waiting != nil && cs[0].State.Waiting.Reason == pods.ReasonCrashLoopBackOff
	})
	p := waitPod(t, e.c.Client, "default", "restarts", 30*time.Second, "restarted", func(p *corev1.Pod) bool {
		cs := p.Status.ContainerStatuses
		return len(cs) == 1 && cs[0].RestartCount >= 1
	})
	cs := p.Status.ContainerStatuses[0]
	if p.Status.Phase != corev1.PodRunning {
		t.Errorf("phase %s while restarting, want Running", p.Status.Phase)
	}
	if lt := cs.LastTerminationState.Terminated; lt == nil || lt.ExitCode != 3 || lt.Reason != "Error" {
		t.Errorf("lastState = %+v, want terminated with exit code 3", cs.LastTerminationState)
	}
	if err := e.c.Client.CoreV1().Pods("default").Delete(ctx, "restarts", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 30*time.Second, "Pod object gone", func() error {
		_, err := e.c.Client.CoreV1().Pods("default").Get(ctx, "restarts", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("still there (err %v)", err)
	})
	e.wantNoSandboxes(t, string(pod.UID))
}
