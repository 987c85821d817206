package kubelet

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cairn-os/cairn/test/runtime"
)

// testHooks wants an exec postStart hook run before the container counts
// as ready (its readiness probe checks the file the hook makes) and an
// httpGet preStop hook run before SIGTERM when the pod is deleted.
func (e *podEnv) testHooks(t *testing.T) {
	grace := int64(5)
	pod := e.createPod(t, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "hooks", Namespace: "default"},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{
				Name: "probee", Image: e.probee, ImagePullPolicy: corev1.PullIfNotPresent,
				Env: []corev1.EnvVar{{Name: "LISTEN", Value: ":8080"}},
				Lifecycle: &corev1.Lifecycle{
					PostStart: &corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: []string{"/usr/bin/probee", "touch", "/started"}}},
					PreStop:   &corev1.LifecycleHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/prestop", Port: intstr.FromInt32(8080)}},
				},
				ReadinessProbe: &corev1.Probe{
					ProbeHandler:  corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"/usr/bin/probee", "check", "/started"}}},
					PeriodSeconds: 1,
				},
			}},
		},
	})
	p := waitPod(t, e.c.Client, "default", "hooks", 60*time.Second, "Ready", func(p *corev1.Pod) bool {
		cs := p.Status.ContainerStatuses
		return len(cs) == 1 && cs[0].Ready
	})
	logPath := e.logPath(t, p.Status.ContainerStatuses[0].ContainerID)
	e.deletePod(t, pod)
	lines := runtime.LogLines(t, logPath, 3)
	i, j := slices.Index(lines, "http GET /prestop"), slices.Index(lines, "bye")
	if i < 0 || j < i {
		t.Errorf("log = %q, want the preStop request and then bye (SIGTERM after the hook)", lines)
	}
}

// testFailedPostStart wants a container whose postStart hook fails
// stopped and restarted.
func (e *podEnv) testFailedPostStart(t *testing.T) {
	grace := int64(1)
	pod := e.createPod(t, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "poststart-fails", Namespace: "default"},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{
				Name: "probee", Image: e.probee, ImagePullPolicy: corev1.PullIfNotPresent,
				Lifecycle: &corev1.Lifecycle{
					PostStart: &corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: []string{"/usr/bin/probee", "check", "/absent"}}},
				},
			}},
		},
	})
	p := waitPod(t, e.c.Client, "default", "poststart-fails", 60*time.Second, "restarted", func(p *corev1.Pod) bool {
		cs := p.Status.ContainerStatuses
		return len(cs) == 1 && cs[0].RestartCount >= 1
	})
	if cs := p.Status.ContainerStatuses[0]; cs.LastTerminationState.Terminated == nil {
		t.Errorf("lastState = %+v, want the run its hook failed", cs.LastTerminationState)
	}
	e.wantEvents(t, pod, "probee", "FailedPostStartHook", "Killing")
	e.deletePod(t, pod)
}

// testLivenessOnFailure wants a container stopped by its liveness probe
// restarted under restartPolicy OnFailure although it exits 0 on SIGTERM:
// the probe, not the exit code, decides.
func (e *podEnv) testLivenessOnFailure(t *testing.T) {
	grace := int64(1)
	pod := e.createPod(t, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "liveness-onfailure", Namespace: "default"},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyOnFailure,
			TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{
				Name: "probee", Image: e.probee, ImagePullPolicy: corev1.PullIfNotPresent,
				LivenessProbe: &corev1.Probe{
					ProbeHandler:  corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"/usr/bin/probee", "check", "/absent"}}},
					PeriodSeconds: 1, FailureThreshold: 1,
				},
			}},
		},
	})
	p := waitPod(t, e.c.Client, "default", "liveness-onfailure", 60*time.Second, "restarted", func(p *corev1.Pod) bool {
		cs := p.Status.ContainerStatuses
		return len(cs) == 1 && cs[0].RestartCount >= 1
	})
	cs := p.Status.ContainerStatuses[0]
	if lt := cs.LastTerminationState.Terminated; lt == nil || lt.ExitCode != 0 {
		t.Errorf("lastState = %+v, want the stopped run with exit code 0", cs.LastTerminationState)
	}
	if p.Status.Phase != corev1.PodRunning {
		t.Errorf("phase %s, want Running", p.Status.Phase)
	}
	e.wantEvents(t, pod, "probee", "Unhealthy", "Killing")
	e.deletePod(t, pod)
}

// logPath is the CRI log file of the container with the Pod status's
// containerID.
func (e *podEnv) logPath(t *testing.T, containerID string) string {
	t.Helper()
	id := strings.TrimPrefix(containerID, "containerd://")
	st, err := e.rt.RuntimeClient.ContainerStatus(context.Background(), &criv1.ContainerStatusRequest{ContainerId: id})
	if err != nil {
		t.Fatalf("CRI status of container %s: %v", id, err)
	}
	return st.Status.LogPath
}

// testMetrics wants the node's metrics to have counted what the earlier
// subtests did: pods started, Lease renewals, probe runs, CRI calls and
// image pulls.
func (e *podEnv) testMetrics(t *testing.T) {
	families, err := e.metrics.Gather()
	if err != nil {
		t.Fatal(err)
	}
	samples := map[string]float64{}
	for _, f := range families {
		for _, m := range f.Metric {
			name := f.GetName()
			for _, l := range m.Label {
				name += "," + l.GetName() + "=" + l.GetValue()
			}
			switch {
			case m.Histogram != nil:
				samples[name] = float64(m.Histogram.GetSampleCount())
			case m.Counter != nil:
				samples[name] = m.Counter.GetValue()
			}
		}
	}
	for _, want := range []string{
		"cairn_kubelet_pod_start_duration_seconds",
		"cairn_kubelet_lease_renewals_total,result=success",
		"cairn_kubelet_probe_runs_total,kind=liveness,result=success",
		"cairn_kubelet_probe_runs_total,kind=liveness,result=failure",
		"cairn_cri_request_duration_seconds,code=OK,method=RunPodSandbox",
		"cairn_cri_request_duration_seconds,code=OK,method=StartContainer",
		"cairn_cri_image_pull_duration_seconds,code=OK",
	} {
		if samples[want] < 1 {
			t.Errorf("metric %s = %v, want at least 1", want, samples[want])
		}
	}
	t.Logf("pods started: %v, Lease renewals: %v", samples["cairn_kubelet_pod_start_duration_seconds"],
		samples["cairn_kubelet_lease_renewals_total,result=success"])
}
