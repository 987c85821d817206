package kubelet

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/util/retry"
	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cairn-os/cairn/agent/kubelet/pods"
	"github.com/cairn-os/cairn/test/poll"
)

// TestPodStatusProof proves, on a node of a real control plane running
// its pods on a real containerd, what the node's Pod status tells and
// what ends a pod, as the upstream conformance suite checks them: the
// observed generation through many spec updates, activeDeadlineSeconds
// updated, readiness gates that others set, the admission's refusal of a
// pod for another OS, and readiness right after the startup probe.
func TestPodStatusProof(t *testing.T) {
	e, cfg := newPodEnv(t, "status-1")
	start(t, cfg)
	e.testNodeReady(t)

	t.Run("observedGeneration follows many spec updates", e.testObservedGeneration)
	t.Run("activeDeadlineSeconds updated ends the pod DeadlineExceeded", e.testActiveDeadline)
	t.Run("readiness gates hold Ready back", e.testReadinessGates)
	t.Run("pod for another OS refused", e.testOSRejected)
	t.Run("ready right after the startup probe", e.testReadyAfterStartup)
}

// updatePod changes the Pod name with change, retrying on conflicts
// with the node's status writes.
func (e *podEnv) updatePod(t *testing.T, pod *corev1.Pod, change func(*corev1.Pod)) {
	t.Helper()
	ctx := context.Background()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		p, err := e.c.Client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		change(p)
		_, err = e.c.Client.CoreV1().Pods(pod.Namespace).Update(ctx, p, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatalf("update Pod %s: %v", pod.Name, err)
	}
}

// helloPod is a pod of one hello container, which runs until SIGTERM.
func (e *podEnv) helloPod(name string) *corev1.Pod {
	grace := int64(1)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.PodSpec{TerminationGracePeriodSeconds: &grace, Containers: []corev1.Container{{
			Name: "hello", Image: e.hello, ImagePullPolicy: corev1.PullIfNotPresent,
		}}},
	}
}

func running(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning }

// testObservedGeneration updates a running pod's spec 150 times in a row
// (its activeDeadlineSeconds, down from 5000): the status, and each
// condition the node sets, come to tell the last generation, 151.
func (e *podEnv) testObservedGeneration(t *testing.T) {
	pod := e.helloPod("generations")
	pod.Spec.ActiveDeadlineSeconds = new(int64(5000))
	pod = e.createPod(t, pod)
	defer e.deletePod(t, pod)
	waitPod(t, e.c.Client, pod.Namespace, pod.Name, 60*time.Second, "running, generation 1 observed", func(p *corev1.Pod) bool {
		return running(p) && p.Status.ObservedGeneration == 1
	})
	const updates = 150
	began := time.Now()
	for range updates {
		e.updatePod(t, pod, func(p *corev1.Pod) { *p.Spec.ActiveDeadlineSeconds-- })
	}
	t.Logf("%d spec updates in %v", updates, time.Since(began))
	got := waitPod(t, e.c.Client, pod.Namespace, pod.Name, 60*time.Second, "observing the last generation", func(p *corev1.Pod) bool {
		return p.Status.ObservedGeneration == updates+1
	})
	t.Logf("generation %d observed %v after the first update", got.Generation, time.Since(began))
	if got.Generation != updates+1 {
		t.Errorf("generation %d, want %d", got.Generation, updates+1)
	}
	for _, ct := range []corev1.PodConditionType{corev1.PodReadyToStartContainers, corev1.PodInitialized, corev1.ContainersReady, corev1.PodReady} {
		i := slices.IndexFunc(got.Status.Conditions, func(c corev1.PodCondition) bool { return c.Type == ct })
		if i < 0 || got.Status.Conditions[i].ObservedGeneration != updates+1 {
			t.Errorf("condition %s: %+v, want observedGeneration %d", ct, got.Status.Conditions, updates+1)
		}
	}
}

// testActiveDeadline gives a running pod, which had none, an
// activeDeadlineSeconds it has already outlived: its container is
// stopped, not removed, and the pod ends Failed with the kubelet's reason
// and message and a DeadlineExceeded event; it is not started again.
func (e *podEnv) testActiveDeadline(t *testing.T) {
	pod := e.createPod(t, e.helloPod("deadline"))
	defer e.deletePod(t, pod)
	run := waitPod(t, e.c.Client, pod.Namespace, pod.Name, 60*time.Second, "running", running)
	// Deadline of 2 s from the start time, which is past once the pod
	// ran a while: poll until it is, so that the update ends the pod.
	poll.Until(t, 10*time.Second, "the pod running for 2 s", func() error {
		if d := time.Since(run.Status.StartTime.Time); d < 2*time.Second {
			return fmt.Errorf("running for %v", d)
		}
		return nil
	})
	e.updatePod(t, pod, func(p *corev1.Pod) { p.Spec.ActiveDeadlineSeconds = new(int64(2)) })
	failed := waitPod(t, e.c.Client, pod.Namespace, pod.Name, 30*time.Second, "Failed", func(p *corev1.Pod) bool {
		return p.Status.Phase == corev1.PodFailed
	})
	if failed.Status.Reason != "DeadlineExceeded" || failed.Status.Message != "Pod was active on the node longer than the specified deadline" {
		t.Errorf("Failed with reason %q, message %q; want DeadlineExceeded and the kubelet's message", failed.Status.Reason, failed.Status.Message)
	}
	cs := containerStatusOf(failed, "hello")
	if cs == nil || cs.State.Terminated == nil || cs.Ready {
		t.Fatalf("hello's status %+v, want terminated, not ready", cs)
	}
	if podCondition(failed, corev1.PodReady) != corev1.ConditionFalse {
		t.Errorf("Ready = %s, want False", podCondition(failed, corev1.PodReady))
	}
	// The container stays, stopped, with no other started in its place.
	ctrs, err := e.rt.RuntimeClient.ListContainers(context.Background(), &criv1.ListContainersRequest{
		Filter: &criv1.ContainerFilter{LabelSelector: map[string]string{pods.LabelPodUID: string(pod.UID)}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(ctrs.Containers) != 1 || ctrs.Containers[0].State != criv1.ContainerState_CONTAINER_EXITED {
		t.Errorf("runtime holds %v, want the one container, exited", ctrs.Containers)
	}
	e.wantPodEvent(t, pod.UID, corev1.EventTypeNormal, "DeadlineExceeded")

	// A deadline the pod has not reached yet ends it when it passes: the
	// pod's worker wakes for it.
	woke := e.wakeups(t)[string(wakeDeadline)]
	later := e.helloPod("deadline-later")
	later.Spec.ActiveDeadlineSeconds = new(int64(4))
	later = e.createPod(t, later)
	defer e.deletePod(t, later)
	waitPod(t, e.c.Client, later.Namespace, later.Name, 60*time.Second, "running", running)
	failed = waitPod(t, e.c.Client, later.Namespace, later.Name, 30*time.Second, "Failed", func(p *corev1.Pod) bool {
		return p.Status.Phase == corev1.PodFailed
	})
	if lasted := failed.Status.ContainerStatuses[0].State.Terminated.FinishedAt.Sub(failed.Status.StartTime.Time); failed.Status.Reason != "DeadlineExceeded" || lasted < 3*time.Second {
		t.Errorf("Failed with reason %q after %v, want DeadlineExceeded after 4 s", failed.Status.Reason, lasted)
	}
	if n := e.wakeups(t)[string(wakeDeadline)] - woke; n < 1 {
		t.Errorf("%v wakeups for the deadline, want 1 or more", n)
	}
}

// wantPodEvent waits for the node's event about the pod uid itself (no
// container) with reason and type.
func (e *podEnv) wantPodEvent(t *testing.T, uid types.UID, eventType, reason string) corev1.Event {
	t.Helper()
	var got corev1.Event
	poll.Until(t, 30*time.Second, "event "+reason, func() error {
		list, err := e.c.Client.CoreV1().Events("default").List(context.Background(), metav1.ListOptions{
			FieldSelector: fields.Set{"involvedObject.uid": string(uid)}.String(),
		})
		if err != nil {
			return err
		}
		i := slices.IndexFunc(list.Items, func(ev corev1.Event) bool { return ev.Reason == reason })
		if i < 0 {
			return fmt.Errorf("none among %v", messages(list.Items))
		}
		got = list.Items[i]
		return nil
	})
	if got.Type != eventType || got.InvolvedObject.FieldPath != "" || got.Source.Component != "kubelet" || got.Source.Host != e.node {
		t.Errorf("event %s: %+v, want a %s about the pod from the kubelet on %s", reason, got, eventType, e.node)
	}
	return got
}

// testReadinessGates runs a pod with two readiness gates whose conditions
// the test sets through the status, as a controller would: the pod is
// Ready only once both are True, its containers ready all the while, and
// the node never drops the conditions it does not own.
func (e *podEnv) testReadinessGates(t *testing.T) {
	const one, two = "example.com/one", "example.com/two"
	pod := e.helloPod("gates")
	pod.Spec.ReadinessGates = []corev1.PodReadinessGate{{ConditionType: one}, {ConditionType: two}}
	pod = e.createPod(t, pod)
	defer e.deletePod(t, pod)
	cond := func(p *corev1.Pod, ct corev1.PodConditionType) corev1.PodCondition {
		for _, c := range p.Status.Conditions {
			if c.Type == ct {
				return c
			}
		}
		return corev1.PodCondition{}
	}
	set := func(ct string, v corev1.ConditionStatus) {
		t.Helper()
		patch := fmt.Sprintf(`{"status":{"conditions":[{"type":%q,"status":%q}]}}`, ct, v)
		if _, err := e.c.Client.CoreV1().Pods(pod.Namespace).Patch(context.Background(), pod.Name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}, "status"); err != nil {
			t.Fatalf("set condition %s: %v", ct, err)
		}
	}
	want := func(what string, ready corev1.ConditionStatus, message string) *corev1.Pod {
		t.Helper()
		p := waitPod(t, e.c.Client, pod.Namespace, pod.Name, 30*time.Second, what, func(p *corev1.Pod) bool {
			r := cond(p, corev1.PodReady)
			return running(p) && cond(p, corev1.ContainersReady).Status == corev1.ConditionTrue && r.Status == ready && r.Message == message
		})
		if r := cond(p, corev1.PodReady); ready == corev1.ConditionFalse && r.Reason != "ReadinessGatesNotReady" {
			t.Errorf("%s: Ready's reason %q, want ReadinessGatesNotReady", what, r.Reason)
		}
		return p
	}
	want("running, its containers ready, itself not", corev1.ConditionFalse,
		`corresponding condition of pod readiness gate "example.com/one" does not exist., corresponding condition of pod readiness gate "example.com/two" does not exist.`)
	set(one, corev1.ConditionTrue)
	want("one gate met", corev1.ConditionFalse, `corresponding condition of pod readiness gate "example.com/two" does not exist.`)
	set(two, corev1.ConditionTrue)
	p := want("both gates met", corev1.ConditionTrue, "")
	if cond(p, one).Status != corev1.ConditionTrue || cond(p, two).Status != corev1.ConditionTrue {
		t.Errorf("gate conditions %+v, want both kept True", p.Status.Conditions)
	}
	set(one, corev1.ConditionFalse)
	want("one gate False again", corev1.ConditionFalse, `the status of pod readiness gate "example.com/one" is not "True", but False`)
}

// testOSRejected creates a pod for Windows on the node: it ends Failed
// with the kubelet's reason and message and a Warning event, and nothing
// of it ever runs.
func (e *podEnv) testOSRejected(t *testing.T) {
	pod := e.helloPod("windows")
	pod.Spec.OS = &corev1.PodOS{Name: corev1.Windows}
	pod = e.createPod(t, pod)
	defer e.deletePod(t, pod)
	failed := waitPod(t, e.c.Client, pod.Namespace, pod.Name, 30*time.Second, "Failed", func(p *corev1.Pod) bool {
		return p.Status.Phase == corev1.PodFailed
	})
	if failed.Status.Reason != "PodOSNotSupported" || failed.Status.Message != "Pod was rejected: Failed to admit pod as the OS field doesn't match node OS" {
		t.Errorf("Failed with reason %q, message %q; want PodOSNotSupported and the kubelet's message", failed.Status.Reason, failed.Status.Message)
	}
	if len(failed.Status.ContainerStatuses) != 0 || failed.Status.ObservedGeneration != 1 {
		t.Errorf("status %+v, want no container status and observedGeneration 1", failed.Status)
	}
	ev := e.wantPodEvent(t, pod.UID, corev1.EventTypeWarning, "PodOSNotSupported")
	if ev.Message != failed.Status.Message {
		t.Errorf("event message %q, want the status's %q", ev.Message, failed.Status.Message)
	}
	e.wantNoSandboxes(t, string(pod.UID))
}

// testReadyAfterStartup runs a container whose startup probe passes 3 s
// after its start and whose readiness probe, which would pass at once,
// has a period of 120 s: the API shows it ready within 3 s of started,
// not a readiness period later.
func (e *podEnv) testReadyAfterStartup(t *testing.T) {
	grace := int64(1)
	c := corev1.Container{Name: "gated", Image: e.probee, ImagePullPolicy: corev1.PullIfNotPresent,
		Env: []corev1.EnvVar{{Name: "TOUCH_FILE", Value: "/started"}, {Name: "TOUCH_AFTER", Value: "3"}, {Name: "LISTEN", Value: ":8080"}}}
	c.StartupProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"/usr/bin/probee", "check", "/started"}}},
		PeriodSeconds: 1, FailureThreshold: 60}
	c.ReadinessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/ready", Port: intstr.FromInt32(8080)}},
		PeriodSeconds: 120}
	pod := e.createPod(t, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "ready-after-startup", Namespace: "default"},
		Spec:       corev1.PodSpec{TerminationGracePeriodSeconds: &grace, Containers: []corev1.Container{c}},
	})
	defer e.deletePod(t, pod)
	hist := e.record(t, pod)
	vs := hist.until(t, 60*time.Second, "gated ready", func(vs []observed) error {
		if cs := containerStatusOf(vs[len(vs)-1].pod, "gated"); cs == nil || !cs.Ready || podCondition(vs[len(vs)-1].pod, corev1.PodReady) != corev1.ConditionTrue {
			return fmt.Errorf("gated: %+v", cs)
		}
		return nil
	})
	var startedAt, readyAt time.Time
	for _, v := range vs {
		cs := containerStatusOf(v.pod, "gated")
		if cs != nil && cs.Started != nil && *cs.Started && startedAt.IsZero() {
			startedAt = v.at
		}
		if cs != nil && cs.Ready && readyAt.IsZero() {
			readyAt = v.at
		}
	}
	if startedAt.IsZero() {
		t.Fatal("never seen started before ready")
	}
	t.Logf("ready %v after started", readyAt.Sub(startedAt))
	if d := readyAt.Sub(startedAt); d > 3*time.Second {
		t.Errorf("ready %v after started, want at once (the readiness period is 120 s)", d)
	}
}
