package kubelet

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/cairn-os/cairn/agent/kubelet/probe"
	"github.com/cairn-os/cairn/test/poll"
)

func podCondition(p *corev1.Pod, t corev1.PodConditionType) corev1.ConditionStatus {
	for _, c := range p.Status.Conditions {
		if c.Type == t {
			return c.Status
		}
	}
	return ""
}

// deletePod deletes a Pod and waits for its object and sandboxes to go.
func (e *podEnv) deletePod(t testing.TB, pod *corev1.Pod) {
	t.Helper()
	ctx := context.Background()
	if err := e.c.Client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 30*time.Second, "Pod object gone", func() error {
		_, err := e.c.Client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("still there (err %v)", err)
	})
	e.wantNoSandboxes(t, string(pod.UID))
}

// testReadinessProbe runs a container that creates /ready 3 s after its
// start, with an exec readiness probe on that file: the pod runs unready,
// then becomes Ready. An httpGet liveness probe on the port it serves
// keeps passing: no restart.
func (e *podEnv) testReadinessProbe(t *testing.T) {
	grace := int64(1)
	created := time.Now()
	pod := e.createPod(t, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "readiness", Namespace: "default"},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{
				Name: "probee", Image: e.probee, ImagePullPolicy: corev1.PullIfNotPresent,
				Env:   []corev1.EnvVar{{Name: "TOUCH_FILE", Value: "/ready"}, {Name: "TOUCH_AFTER", Value: "3"}, {Name: "LISTEN", Value: ":8080"}},
				Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}},
				ReadinessProbe: &corev1.Probe{
					ProbeHandler:  corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"/usr/bin/probee", "check", "/ready"}}},
					PeriodSeconds: 1,
				},
				LivenessProbe: &corev1.Probe{
					ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromString("http")}},
					PeriodSeconds: 1, FailureThreshold: 1, InitialDelaySeconds: 1,
				},
			}},
		},
	})
	running := waitPod(t, e.c.Client, "default", "readiness", 60*time.Second, "Running", func(p *corev1.Pod) bool {
		return p.Status.Phase == corev1.PodRunning && len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].State.Running != nil
	})
	t.Logf("Running %v after Create", time.Since(created).Round(time.Millisecond))
	if cs := running.Status.ContainerStatuses[0]; cs.Ready || podCondition(running, corev1.PodReady) != corev1.ConditionFalse ||
		podCondition(running, corev1.ContainersReady) != corev1.ConditionFalse {
		t.Errorf("running before its readiness probe passed: ready %v, conditions %v; want not ready", cs.Ready, running.Status.Conditions)
	}
	started := running.Status.ContainerStatuses[0].State.Running.StartedAt.Time
	ready := waitPod(t, e.c.Client, "default", "readiness", 30*time.Second, "Ready", func(p *corev1.Pod) bool {
		return podCondition(p, corev1.PodReady) == corev1.ConditionTrue
	})
	t.Logf("Ready %v after Create, %v after the container's start (file made after 3 s, probe period 1 s)",
		time.Since(created).Round(time.Millisecond), time.Since(started).Round(time.Second))
	if cs := ready.Status.ContainerStatuses[0]; !cs.Ready || podCondition(ready, corev1.ContainersReady) != corev1.ConditionTrue {
		t.Errorf("container ready %v, conditions %v; want ready, ContainersReady True", cs.Ready, ready.Status.Conditions)
	}
	if d := time.Since(started); d < 3*time.Second {
		t.Errorf("Ready %v after the container's start, before the file was made", d)
	}
	// The passing liveness probe restarts nothing: three more runs of it.
	e.waitCount(t, "cairn_kubelet_probe_runs_total", "kind", string(probe.Liveness), 3)
	again, err := e.c.Client.CoreV1().Pods("default").Get(context.Background(), "readiness", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if cs := again.Status.ContainerStatuses[0]; cs.RestartCount != 0 || !cs.Ready {
		t.Errorf("after 3 more liveness probes: restarts %d, ready %v; want 0 restarts, still ready", cs.RestartCount, cs.Ready)
	}
	e.deletePod(t, pod)
}

// testLivenessProbe wants a container whose tcpSocket liveness probe
// fails (nothing listens) stopped and restarted, counting the restart.
func (e *podEnv) testLivenessProbe(t *testing.T) {
	grace := int64(1)
	created := time.Now()
	pod := e.createPod(t, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "liveness", Namespace: "default"},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{
				Name: "probee", Image: e.probee, ImagePullPolicy: corev1.PullIfNotPresent,
				LivenessProbe: &corev1.Probe{
					ProbeHandler:  corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(9999)}},
					PeriodSeconds: 1, FailureThreshold: 1,
				},
			}},
		},
	})
	p := waitPod(t, e.c.Client, "default", "liveness", 60*time.Second, "restarted", func(p *corev1.Pod) bool {
		cs := p.Status.ContainerStatuses
		return len(cs) == 1 && cs[0].RestartCount >= 1
	})
	t.Logf("restarted %v after Create (liveness period 1 s, failureThreshold 1, then the 10 s CrashLoopBackOff)", time.Since(created).Round(time.Millisecond))
	cs := p.Status.ContainerStatuses[0]
	if lt := cs.LastTerminationState.Terminated; lt == nil {
		t.Errorf("lastState = %+v, want the stopped run", cs.LastTerminationState)
	} else {
		t.Logf("lastState: exit code %d, reason %s", lt.ExitCode, lt.Reason)
	}
	e.deletePod(t, pod)
}
