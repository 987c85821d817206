package kubelet

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cairn-os/cairn/agent/kubelet/pods"
	"github.com/cairn-os/cairn/internal/crilog"
)

// testInitContainers runs three init containers that each append their
// number to a file of an emptyDir volume and fail unless the ones before
// did, and wants, in every version of the Pod the API held, no init
// container begun before the ones before it completed and the app
// container not before all of them; in the end each init container
// terminated with reason Completed, in order by the runtime's clock, and
// the app running.
func (e *podEnv) testInitContainers(t *testing.T) {
	grace := int64(1)
	work := []corev1.VolumeMount{{Name: "work", MountPath: "/work"}}
	initC := func(n int) corev1.Container {
		return corev1.Container{Name: fmt.Sprintf("init-%d", n), Image: e.probee, ImagePullPolicy: corev1.PullIfNotPresent,
			Command: []string{"/usr/bin/probee", "seq", "/work/order", strconv.Itoa(n)}, VolumeMounts: work}
	}
	pod := e.createPod(t, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "inits", Namespace: "default"},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever, // an init container out of order fails the pod
			TerminationGracePeriodSeconds: &grace,
			Volumes:                       []corev1.Volume{{Name: "work", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
			InitContainers:                []corev1.Container{initC(1), initC(2), initC(3)},
			Containers:                    []corev1.Container{{Name: "app", Image: e.probee, ImagePullPolicy: corev1.PullIfNotPresent, VolumeMounts: work}},
		},
	})
	h := e.record(t, pod)
	vs := h.until(t, 60*time.Second, "app running", func(vs []observed) error {
		p := vs[len(vs)-1].pod
		if p.Status.Phase == corev1.PodFailed {
			return fmt.Errorf("pod Failed: %+v", p.Status)
		}
		if cs := containerStatusOf(p, "app"); cs == nil || cs.State.Running == nil {
			return fmt.Errorf("app: %+v", cs)
		}
		return nil
	})
	completed := func(cs corev1.ContainerStatus) bool {
		return cs.State.Terminated != nil && cs.State.Terminated.ExitCode == 0 && cs.State.Terminated.Reason == "Completed"
	}
	begun := func(cs corev1.ContainerStatus) bool { return cs.ContainerID != "" || cs.State.Waiting == nil }
	for _, v := range vs {
		st := v.pod.Status
		allDone := len(st.InitContainerStatuses) == 3
		for i, cs := range st.InitContainerStatuses {
			if begun(cs) {
				for _, before := range st.InitContainerStatuses[:i] {
					if !completed(before) {
						t.Errorf("version %s: %s begun while %s was not Completed: %+v", v.pod.ResourceVersion, cs.Name, before.Name, st.InitContainerStatuses)
					}
				}
			} else if w := cs.State.Waiting; i > 0 && w.Reason != pods.ReasonPodInitializing {
				t.Errorf("version %s: %s waiting with %q, want PodInitializing", v.pod.ResourceVersion, cs.Name, w.Reason)
			}
			allDone = allDone && completed(cs)
		}
		for _, cs := range st.ContainerStatuses {
			if begun(cs) && !allDone {
				t.Errorf("version %s: app begun before the init containers completed: %+v", v.pod.ResourceVersion, st.InitContainerStatuses)
			}
		}
		if init := podCondition(v.pod, corev1.PodInitialized); init != "" && (init == corev1.ConditionTrue) != allDone {
			t.Errorf("version %s: Initialized %s while the init containers are %+v", v.pod.ResourceVersion, init, st.InitContainerStatuses)
		}
	}

	final := vs[len(vs)-1].pod.Status
	var names []string
	var prevEnd time.Time
	for i, cs := range final.InitContainerStatuses {
		names = append(names, cs.Name)
		if !completed(cs) || !cs.Ready {
			t.Errorf("%s: %+v, want terminated, exit code 0, reason Completed, ready", cs.Name, cs)
		}
		rt := e.criContainer(t, cs.ContainerID)
		started, finished := time.Unix(0, rt.StartedAt), time.Unix(0, rt.FinishedAt)
		if started.Before(prevEnd) {
			t.Errorf("%s started at %v, before the one before it finished at %v", cs.Name, started, prevEnd)
		}
		prevEnd = finished
		if lines := lineTexts(logEntries(t, rt.LogPath)); !slices.Equal(lines, []string{fmt.Sprintf("seq %d", i+1)}) {
			t.Errorf("%s printed %q, want its seq line", cs.Name, lines)
		}
	}
	if want := []string{"init-1", "init-2", "init-3"}; !slices.Equal(names, want) {
		t.Errorf("initContainerStatuses %v, want %v", names, want)
	}
	app := e.criContainer(t, final.ContainerStatuses[0].ContainerID)
	if started := time.Unix(0, app.StartedAt); started.Before(prevEnd) {
		t.Errorf("app started at %v, before init-3 finished at %v", started, prevEnd)
	}
	if podCondition(vs[len(vs)-1].pod, corev1.PodInitialized) != corev1.ConditionTrue {
		t.Errorf("Initialized %s, want True", podCondition(vs[len(vs)-1].pod, corev1.PodInitialized))
	}
	e.deletePod(t, pod)
}

// testCreateContainerError runs an image whose config names a user but
// whose filesystem has no /etc/passwd to find it in, which containerd's
// CreateContainer refuses, and wants the container waiting with
// CreateContainerError and the runtime's message, and a Failed event
// saying so.
func (e *podEnv) testCreateContainerError(t *testing.T) {
	image := e.imageWithUser(t, "no-such-user", "cairn-test/probee-no-user:v1")

	pod := e.createPod(t, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "create-error", Namespace: "default"},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: image}}},
	})
	p := waitPod(t, e.c.Client, "default", "create-error", 60*time.Second, "waiting with CreateContainerError", func(p *corev1.Pod) bool {
		cs := p.Status.ContainerStatuses
		return len(cs) == 1 && cs[0].State.Waiting != nil && cs[0].State.Waiting.Reason == "CreateContainerError"
	})
	msg := p.Status.ContainerStatuses[0].State.Waiting.Message
	t.Logf("CreateContainerError: %s", msg)
	if !strings.HasPrefix(msg, "failed to create containerd container: ") || !strings.Contains(msg, "etc") {
		t.Errorf("waiting message %q, want containerd's, that it found no /etc to look the user up in", msg)
	}
	if p.Status.Phase != corev1.PodPending || p.Status.ContainerStatuses[0].ContainerID != "" {
		t.Errorf("phase %s, containerID %q: want Pending and no container", p.Status.Phase, p.Status.ContainerStatuses[0].ContainerID)
	}
	e.containerEvents(t, pod, "c", "Failed", func(m string) bool { return m == "Error: "+msg })
	e.deletePod(t, pod)
}

// testPreStopGrace deletes a pod with a grace period of 6 s whose
// containers have preStop hooks: one's takes 3 s and it ignores SIGTERM,
// so it must be SIGTERMed once the hook returned and SIGKILLed what is
// left of the grace period later; the other's fails, which is told as a
// FailedPreStopHook event, and it is stopped with the grace period.
func (e *podEnv) testPreStopGrace(t *testing.T, spy *criSpy) {
	grace := int64(6)
	pod := e.createPod(t, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "prestop", Namespace: "default"},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{
				Name: "slow-hook", Image: e.probee, ImagePullPolicy: corev1.PullIfNotPresent,
				Env: []corev1.EnvVar{{Name: "LISTEN", Value: ":8080"}, {Name: "IGNORE_TERM", Value: "1"}},
				Lifecycle: &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{
					HTTPGet: &corev1.HTTPGetAction{Path: "/sleep/3", Port: intstr.FromInt32(8080)}}},
			}, {
				Name: "failing-hook", Image: e.probee, ImagePullPolicy: corev1.PullIfNotPresent,
				Lifecycle: &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{
					Exec: &corev1.ExecAction{Command: []string{"/usr/bin/probee", "check", "/absent"}}}},
			}},
		},
	})
	p := waitPod(t, e.c.Client, "default", "prestop", 60*time.Second, "Running", func(p *corev1.Pod) bool {
		cs := p.Status.ContainerStatuses
		return len(cs) == 2 && cs[0].State.Running != nil && cs[1].State.Running != nil
	})
	slow, failing := containerStatusOf(p, "slow-hook"), containerStatusOf(p, "failing-hook")
	slowLog, failingLog := e.logPath(t, slow.ContainerID), e.logPath(t, failing.ContainerID)
	deleted := time.Now()
	e.deletePod(t, pod)
	t.Logf("Pod gone %v after Delete", time.Since(deleted).Round(time.Millisecond))

	entryAt := func(entries []crilog.Entry, line string) time.Time {
		for _, en := range entries {
			if string(en.Line) == line {
				return en.Time
			}
		}
		t.Errorf("no %q in the log %q", line, lineTexts(entries))
		return time.Time{}
	}
	slowEntries := logEntries(t, slowLog)
	hookAt, termAt := entryAt(slowEntries, "http GET /sleep/3"), entryAt(slowEntries, "SIGTERM ignored")
	t.Logf("slow-hook: preStop request %v after Delete, SIGTERM %v after it", hookAt.Sub(deleted).Round(time.Millisecond), termAt.Sub(hookAt).Round(time.Millisecond))
	if d := termAt.Sub(hookAt); d < 3*time.Second || d >= 6*time.Second {
		t.Errorf("slow-hook: SIGTERM %v after its preStop hook began, want once the 3 s hook returned, within the 6 s grace period", d)
	}
	stops := spy.stopsOf(strings.TrimPrefix(slow.ContainerID, "containerd://"))
	if len(stops) != 1 {
		t.Fatalf("slow-hook: StopContainer calls %+v, want one", stops)
	}
	s := stops[0]
	t.Logf("slow-hook: StopContainer timeout %d s, returned %v after its call", s.timeout, s.returned.Sub(s.called).Round(time.Millisecond))
	if s.timeout < 2 || s.timeout > 3 {
		t.Errorf("slow-hook: StopContainer timeout %d s, want what is left of the 6 s grace period after the 3 s hook (2 or 3)", s.timeout)
	}
	if d := s.returned.Sub(s.called); d < time.Duration(s.timeout)*time.Second-500*time.Millisecond {
		t.Errorf("slow-hook ignores SIGTERM but was gone %v after StopContainer, before the timeout %d s", d, s.timeout)
	}

	failingEntries := logEntries(t, failingLog)
	if lines := lineTexts(failingEntries); len(lines) == 0 || lines[len(lines)-1] != "bye" {
		t.Errorf("failing-hook's log %q, want it stopped with SIGTERM after its failed hook (bye)", lines)
	}
	stops = spy.stopsOf(strings.TrimPrefix(failing.ContainerID, "containerd://"))
	if len(stops) != 1 || stops[0].timeout < 5 || stops[0].timeout > 6 {
		t.Errorf("failing-hook: StopContainer calls %+v, want one with about the 6 s grace period", stops)
	}
	e.containerEvents(t, pod, "failing-hook", "FailedPreStopHook", func(m string) bool { return strings.HasPrefix(m, "PreStopHook failed: ") })
}

// testStatusConflict changes the Pod while the agent syncs it — its
// container ended, under restartPolicy Never — so that the agent's status
// write carries a stale resourceVersion and is refused. It wants the
// write retried with the fresh Pod (the wakeups metric counts a conflict)
// and the status landing, keeping the change, with the pod's one
// container not run again.
func (e *podEnv) testStatusConflict(t *testing.T, spy *criSpy) {
	ctx := context.Background()
	grace := int64(1)
	pod := e.createPod(t, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "conflict", Namespace: "default"},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: &grace,
			Containers:                    []corev1.Container{{Name: "probee", Image: e.probee, ImagePullPolicy: corev1.PullIfNotPresent}},
		},
	})
	running := waitPod(t, e.c.Client, "default", "conflict", 60*time.Second, "Running", func(p *corev1.Pod) bool {
		return p.Status.Phase == corev1.PodRunning && len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].State.Running != nil
	})
	containerID := running.Status.ContainerStatuses[0].ContainerID
	id := strings.TrimPrefix(containerID, "containerd://")
	sandbox := e.onlySandbox(t, pod)
	before := e.quietWakeups(t)

	// When the agent reads the ended container, the Pod changes.
	var changed atomic.Bool
	var changeErr atomic.Value
	spy.setOnStatus(func(st *criv1.ContainerStatus) {
		if st.Id != id || st.State != criv1.ContainerState_CONTAINER_EXITED || changed.Swap(true) {
			return
		}
		patch := []byte(`{"metadata":{"labels":{"cairn.test/changed":"while-syncing"}}}`)
		if _, err := e.c.Client.CoreV1().Pods("default").Patch(ctx, "conflict", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			changeErr.Store(err)
		}
	})
	defer spy.setOnStatus(nil)
	e.crash(t, containerID)

	ended := waitPod(t, e.c.Client, "default", "conflict", 30*time.Second, "Succeeded", func(p *corev1.Pod) bool {
		return p.Status.Phase == corev1.PodSucceeded
	})
	if !changed.Load() {
		t.Fatal("the agent never read the ended container's status")
	}
	if err := changeErr.Load(); err != nil {
		t.Fatalf("change the Pod while the agent syncs: %v", err)
	}
	got := diff(before, e.wakeups(t))
	if got["conflict"] < 1 {
		t.Errorf("wakeups from the end to the status landing: %v, want a conflict one (the write retried with the fresh Pod)", got)
	}
	if ended.Labels["cairn.test/changed"] != "while-syncing" {
		t.Errorf("labels %v after the status write, want the change kept", ended.Labels)
	}
	cs := ended.Status.ContainerStatuses[0]
	if cs.ContainerID != containerID || cs.RestartCount != 0 || cs.State.Terminated == nil || cs.State.Terminated.Reason != "Completed" {
		t.Errorf("container status %+v, want %s terminated (Completed), never restarted", cs, containerID)
	}
	// Nothing ran again: the same one sandbox, the same one container.
	if got := e.onlySandbox(t, pod); got != sandbox {
		t.Errorf("sandbox %s, want the pod's only one %s", got, sandbox)
	}
	ctrs, err := e.rt.RuntimeClient.ListContainers(ctx, &criv1.ListContainersRequest{
		Filter: &criv1.ContainerFilter{LabelSelector: map[string]string{pods.LabelPodUID: string(pod.UID)}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(ctrs.Containers) != 1 || ctrs.Containers[0].Id != id {
		t.Errorf("runtime has %d containers of the pod, want only %s", len(ctrs.Containers), id)
	}
	e.deletePod(t, pod)
}
