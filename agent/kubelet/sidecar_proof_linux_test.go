package kubelet

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// TestSidecars proves, on a node of a real control plane running its
// pods on a real containerd, sidecar containers as KEP-753 defines them:
// init containers with restartPolicy Always that the containers after
// them wait for only until they started, restarted under the pod's
// restartPolicy Never, probed and counted for the pod's readiness, and
// stopped after the app containers, the last one first, each with its
// preStop hook, when the pod is deleted or its app containers completed.
func TestSidecars(t *testing.T) {
	e, cfg := newPodEnv(t, "sidecar-1")
	spy := &criSpy{RuntimeServiceClient: cfg.Pods.Runtime}
	cfg.Pods.Runtime = spy
	start(t, cfg)
	e.testNodeReady(t)

	t.Run("started in order, gated on the startup probe, restarted under Never, stopped in reverse order", func(t *testing.T) {
		e.testSidecarLife(t, spy)
	})
	t.Run("a pod whose app completed stops its sidecars and ends as its app did", func(t *testing.T) {
		e.testSidecarsComplete(t, spy)
	})
}

var always = corev1.ContainerRestartPolicyAlways

// sidecar is a probee sidecar serving HTTP on port, whose preStop hook
// asks it for /prestop.
func (e *podEnv) sidecar(name string, port int32, env ...corev1.EnvVar) corev1.Container {
	return corev1.Container{
		Name: name, Image: e.probee, ImagePullPolicy: corev1.PullIfNotPresent, RestartPolicy: &always,
		Env:          append([]corev1.EnvVar{{Name: "LISTEN", Value: fmt.Sprintf(":%d", port)}}, env...),
		VolumeMounts: []corev1.VolumeMount{{Name: "work", MountPath: "/work"}},
		Lifecycle: &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{
			HTTPGet: &corev1.HTTPGetAction{Path: "/prestop", Port: intstr.FromInt32(port)}}},
	}
}

// testSidecarLife runs a sidecar that creates /work/started 2 s after its
// start, with a startup and a readiness probe on that file, then a
// regular init container that fails unless the file exists, then a
// second sidecar, then the app, under restartPolicy Never. It wants the
// regular init container begun only once the first sidecar started, the
// sidecars' statuses started and ready, the pod Initialized, Running and
// Ready; a sidecar that exits restarted and the pod running on; and, on
// deletion, the app stopped first, then the second sidecar, then the
// first, each after its preStop hook.
func (e *podEnv) testSidecarLife(t *testing.T, spy *criSpy) {
	grace := int64(10)
	startedProbe := &corev1.Probe{PeriodSeconds: 1, ProbeHandler: corev1.ProbeHandler{
		Exec: &corev1.ExecAction{Command: []string{"/usr/bin/probee", "check", "/work/started"}}}}
	sc1 := e.sidecar("sc-1", 8081, corev1.EnvVar{Name: "TOUCH_FILE", Value: "/work/started"}, corev1.EnvVar{Name: "TOUCH_AFTER", Value: "2"})
	sc1.StartupProbe, sc1.ReadinessProbe = startedProbe, startedProbe
	// sc-3 is ready once it serves, which its preStop hook needs.
	sc3 := e.sidecar("sc-3", 8083)
	sc3.ReadinessProbe = &corev1.Probe{PeriodSeconds: 1, ProbeHandler: corev1.ProbeHandler{
		HTTPGet: &corev1.HTTPGetAction{Path: "/ready", Port: intstr.FromInt32(8083)}}}
	pod := e.createPod(t, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "sidecars", Namespace: "default"},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: &grace,
			Volumes:                       []corev1.Volume{{Name: "work", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
			InitContainers: []corev1.Container{sc1, {
				Name: "init-2", Image: e.probee, ImagePullPolicy: corev1.PullIfNotPresent,
				Command:      []string{"/usr/bin/probee", "check", "/work/started"},
				VolumeMounts: []corev1.VolumeMount{{Name: "work", MountPath: "/work"}},
			}, sc3},
			Containers: []corev1.Container{{Name: "app", Image: e.probee, ImagePullPolicy: corev1.PullIfNotPresent}},
		},
	})
	h := e.record(t, pod)
	vs := h.until(t, 60*time.Second, "Running and Ready", func(vs []observed) error {
		p := vs[len(vs)-1].pod
		if p.Status.Phase == corev1.PodFailed {
			return fmt.Errorf("pod Failed: %+v", p.Status)
		}
		if p.Status.Phase != corev1.PodRunning || podCondition(p, corev1.PodReady) != corev1.ConditionTrue {
			return fmt.Errorf("phase %s, Ready %s", p.Status.Phase, podCondition(p, corev1.PodReady))
		}
		return nil
	})
	for _, v := range vs {
		p := v.pod
		sc1, init2 := containerStatusOf(p, "sc-1"), containerStatusOf(p, "init-2")
		if init2 != nil && init2.ContainerID != "" && (sc1 == nil || sc1.Started == nil || !*sc1.Started) {
			t.Errorf("version %s: init-2 begun while sc-1 had not started: %+v", p.ResourceVersion, sc1)
		}
		if app := containerStatusOf(p, "app"); app != nil && app.ContainerID != "" && p.Status.Phase != corev1.PodRunning {
			t.Errorf("version %s: app begun, pod %s, want Running", p.ResourceVersion, p.Status.Phase)
		}
		if podCondition(p, corev1.PodReady) == corev1.ConditionTrue && (sc1 == nil || !sc1.Ready) {
			t.Errorf("version %s: pod Ready while sc-1 is not: %+v", p.ResourceVersion, sc1)
		}
	}
	p := vs[len(vs)-1].pod
	for _, name := range []string{"sc-1", "sc-3"} {
		cs := containerStatusOf(p, name)
		if cs.State.Running == nil || cs.Started == nil || !*cs.Started || !cs.Ready {
			t.Errorf("%s: %+v, want running, started and ready", name, cs)
		}
	}
	if cs := containerStatusOf(p, "init-2"); cs.State.Terminated == nil || cs.State.Terminated.Reason != "Completed" {
		t.Errorf("init-2: %+v, want Completed", cs.State)
	}
	if c := podCondition(p, corev1.PodInitialized); c != corev1.ConditionTrue {
		t.Errorf("Initialized %s, want True", c)
	}
	if names := statusNames(p.Status.InitContainerStatuses); !slices.Equal(names, []string{"sc-1", "init-2", "sc-3"}) {
		t.Errorf("initContainerStatuses %v, want sc-1, init-2, sc-3", names)
	}

	// sc-3 exits (SIGTERM: exit code 0); under restartPolicy Never it
	// restarts nonetheless, and the pod runs on.
	app := containerStatusOf(p, "app").ContainerID
	e.crash(t, containerStatusOf(p, "sc-3").ContainerID)
	p = waitPod(t, e.c.Client, "default", "sidecars", 60*time.Second, "with sc-3 restarted", func(p *corev1.Pod) bool {
		cs := containerStatusOf(p, "sc-3")
		return cs.RestartCount == 1 && cs.State.Running != nil && podCondition(p, corev1.PodReady) == corev1.ConditionTrue
	})
	if p.Status.Phase != corev1.PodRunning {
		t.Errorf("phase %s after sc-3 restarted, want Running", p.Status.Phase)
	}
	if cs := containerStatusOf(p, "app"); cs.ContainerID != app || cs.RestartCount != 0 || cs.State.Running == nil {
		t.Errorf("app %+v after sc-3 restarted, want %s running on", cs, app)
	}
	if cs := containerStatusOf(p, "sc-3"); cs.LastTerminationState.Terminated == nil {
		t.Errorf("sc-3: no last termination state: %+v", cs)
	}

	ids := map[string]string{}
	for _, name := range []string{"app", "sc-1", "sc-3"} {
		ids[name] = strings.TrimPrefix(containerStatusOf(p, name).ContainerID, "containerd://")
	}
	logs := map[string]string{"sc-1": e.logPath(t, ids["sc-1"]), "sc-3": e.logPath(t, ids["sc-3"])}
	e.deletePod(t, pod)
	e.wantStoppedInOrder(t, spy, ids, "app", "sc-3", "sc-1")
	for name, path := range logs {
		lines := lineTexts(logEntries(t, path))
		if i := slices.Index(lines, "http GET /prestop"); i < 0 || lines[len(lines)-1] != "bye" {
			t.Errorf("%s's log %q, want its preStop request and then bye", name, lines)
		}
	}
}

// testSidecarsComplete runs an app that exits 0 after 3 s beside two
// sidecars under restartPolicy Never, the first of which ignores SIGTERM
// (and so ends SIGKILLed, exit code 137). It wants the pod Succeeded, as
// its app, with the sidecars stopped after the app, the second first,
// their preStop hooks run at once before.
func (e *podEnv) testSidecarsComplete(t *testing.T, spy *criSpy) {
	grace := int64(3)
	pod := e.createPod(t, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "sidecars-done", Namespace: "default"},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: &grace,
			Volumes:                       []corev1.Volume{{Name: "work", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
			InitContainers:                []corev1.Container{e.sidecar("sc-1", 8081, corev1.EnvVar{Name: "IGNORE_TERM", Value: "1"}), e.sidecar("sc-2", 8082)},
			Containers: []corev1.Container{{Name: "app", Image: e.probee, ImagePullPolicy: corev1.PullIfNotPresent,
				Command: []string{"/usr/bin/probee", "sleep", "3"}}},
		},
	})
	p := waitPod(t, e.c.Client, "default", pod.Name, 90*time.Second, "Succeeded", func(p *corev1.Pod) bool {
		return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
	})
	if p.Status.Phase != corev1.PodSucceeded {
		t.Errorf("phase %s, want Succeeded as its app: %+v", p.Status.Phase, p.Status)
	}
	ids := map[string]string{}
	for _, name := range []string{"app", "sc-1", "sc-2"} {
		cs := containerStatusOf(p, name)
		if cs.State.Terminated == nil {
			t.Fatalf("%s: %+v, want terminated", name, cs.State)
		}
		ids[name] = strings.TrimPrefix(cs.ContainerID, "containerd://")
	}
	if code := containerStatusOf(p, "sc-1").State.Terminated.ExitCode; code != 137 {
		t.Errorf("sc-1 exit code %d, want 137 (SIGKILLed, it ignores SIGTERM)", code)
	}
	appEnd := time.Unix(0, e.criContainer(t, ids["app"]).FinishedAt)
	hookAt := map[string]time.Time{}
	for _, name := range []string{"sc-1", "sc-2"} {
		rt := e.criContainer(t, ids[name])
		if end := time.Unix(0, rt.FinishedAt); end.Before(appEnd) {
			t.Errorf("%s finished at %v, before the app at %v", name, end, appEnd)
		}
		for _, en := range logEntries(t, rt.LogPath) {
			if string(en.Line) == "http GET /prestop" {
				hookAt[name] = en.Time
			}
		}
		if hookAt[name].IsZero() {
			t.Errorf("%s's log %q, want its preStop request", name, lineTexts(logEntries(t, rt.LogPath)))
		}
	}
	e.wantStoppedInOrder(t, spy, ids, "sc-2", "sc-1")
	// The preStop hooks run at once, as the kubelet's: sc-1's does not
	// wait for sc-2 to be gone.
	if stops := spy.stopsOf(ids["sc-2"]); len(stops) == 1 && !hookAt["sc-1"].Before(stops[0].returned) {
		t.Errorf("sc-1's preStop hook ran at %v, after sc-2 was gone at %v", hookAt["sc-1"], stops[0].returned)
	}
	e.deletePod(t, pod)
}

// wantStoppedInOrder wants the agent to have stopped each of the
// containers names (their runtime IDs in ids) once, each only after the
// one before it was gone.
func (e *podEnv) wantStoppedInOrder(t *testing.T, spy *criSpy, ids map[string]string, names ...string) {
	t.Helper()
	var prev stopCall
	for i, name := range names {
		stops := spy.stopsOf(ids[name])
		if len(stops) != 1 {
			t.Errorf("%s: StopContainer calls %+v, want one", name, stops)
			return
		}
		if i > 0 && stops[0].called.Before(prev.returned) {
			t.Errorf("%s stopped at %v, before %s was gone at %v", name, stops[0].called, names[i-1], prev.returned)
		}
		prev = stops[0]
	}
}

func statusNames(cs []corev1.ContainerStatus) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.Name)
	}
	return out
}
