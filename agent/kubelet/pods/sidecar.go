package pods

import (
	"context"
	"errors"
	"time"

	corev1 "k8s.io/api/core/v1"
	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Sidecars (KEP-753): init containers with restartPolicy Always. One
// starts in its turn among the init containers, and the container after
// it starts once it has started — it runs, its postStart hook returned
// and its startup probe, if any, passed — rather than exited. It restarts
// whenever it exits, with the CrashLoopBackOff, whatever the pod's
// restartPolicy; its exits count neither for the pod's phase nor against
// its initialization. Once the app containers of a pod that does not
// restart them have all ended, the sidecars are stopped, the last one
// first, and the pod ends as its app containers did. When the pod is
// killed, the sidecars are stopped after its app containers, the last
// one first, each with its preStop hook, within the one grace period.

// isSidecar says whether the init container c is a sidecar.
func isSidecar(c *corev1.Container) bool {
	return c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways
}

// sidecarStarted says whether the sidecar whose status is cs started.
func (w *Worker) sidecarStarted(pod *corev1.Pod, cs ContainerStatus) bool {
	if cs.State != Running {
		return false
	}
	return w.cfg.Started == nil || w.cfg.Started(pod, cs.Name, cs.ID)
}

// begunAfter says, for each init container of pod, whether a container
// after it, init or app, has been made in the sandbox (history).
func begunAfter(pod *corev1.Pod, history map[string][]*criv1.ContainerStatus) []bool {
	out := make([]bool, len(pod.Spec.InitContainers))
	later := false
	for i := range pod.Spec.Containers {
		later = later || len(history[pod.Spec.Containers[i].Name]) > 0
	}
	for i := len(pod.Spec.InitContainers) - 1; i >= 0; i-- {
		out[i] = later
		later = later || len(history[pod.Spec.InitContainers[i].Name]) > 0
	}
	return out
}

// appsEnded says whether every app container of pod exited for good in
// the sandbox (history): none restarts under the pod's restartPolicy, and
// none is to restart for failing a probe (unhealthy).
func appsEnded(pod *corev1.Pod, history map[string][]*criv1.ContainerStatus, unhealthy func(id string) bool) bool {
	policy := pod.Spec.RestartPolicy
	if policy == corev1.RestartPolicyAlways || policy == "" || len(pod.Spec.Containers) == 0 {
		return false
	}
	for i := range pod.Spec.Containers {
		h := history[pod.Spec.Containers[i].Name]
		if len(h) == 0 {
			return false
		}
		latest := h[len(h)-1]
		if latest.State != criv1.ContainerState_CONTAINER_EXITED || Restarts(policy, latest.ExitCode) ||
			policy != corev1.RestartPolicyNever && unhealthy(latest.Id) {
			return false
		}
	}
	return true
}

// stopSidecars stops the running sidecars among the init containers of
// pod whose statuses are inits, the last one first, each with its preStop
// hook, all within grace, and updates their statuses.
func (w *Worker) stopSidecars(ctx context.Context, pod *corev1.Pod, inits []ContainerStatus, podIP string, grace time.Duration) error {
	deadline := time.Now().Add(grace)
	var errs []error
	for i := len(inits) - 1; i >= 0; i-- {
		cs := &inits[i]
		if !isSidecar(&pod.Spec.InitContainers[i]) || cs.State != Running {
			continue
		}
		if err := w.stop(ctx, pod, cs.ID, cs.Name, podIP, left(deadline, grace)); err != nil {
			errs = append(errs, err)
			continue
		}
		st, err := w.status(ctx, cs.Name, cs.ID)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		*cs = st
	}
	return errors.Join(errs...)
}

// left is what is left until deadline of a grace period: none if the
// grace period was none (a forced deletion), else at least a nanosecond,
// so that stop still gives minStopGrace, as to a container whose preStop
// hook used the grace period up.
func left(deadline time.Time, grace time.Duration) time.Duration {
	if grace == 0 {
		return 0
	}
	return max(time.Until(deadline), time.Nanosecond)
}

// stopInOrder stops the running containers of a sandbox of pod: the app
// containers at once, as the kubelet does, then the sidecars one after
// another, the last one first, all within the pod's grace period.
func (w *Worker) stopInOrder(ctx context.Context, pod *corev1.Pod, containers []*criv1.Container, podIP string, grace time.Duration) error {
	deadline := time.Now().Add(grace)
	rank := map[string]int{} // a sidecar's place among the init containers
	for i := range pod.Spec.InitContainers {
		if isSidecar(&pod.Spec.InitContainers[i]) {
			rank[pod.Spec.InitContainers[i].Name] = i + 1
		}
	}
	var apps []*criv1.Container
	sidecars := make([]*criv1.Container, len(pod.Spec.InitContainers)+1)
	for _, c := range containers {
		w.unhealthy.Delete(c.Id)
		if c.State != criv1.ContainerState_CONTAINER_RUNNING {
			continue
		}
		if r := rank[c.GetMetadata().GetName()]; r > 0 {
			sidecars[r] = c
			continue
		}
		apps = append(apps, c)
	}
	errs := []error{w.stopAll(ctx, pod, apps, podIP, grace)}
	for i := len(sidecars) - 1; i > 0; i-- {
		if c := sidecars[i]; c != nil {
			errs = append(errs, w.stop(ctx, pod, c.Id, c.GetMetadata().GetName(), podIP, left(deadline, grace)))
		}
	}
	return errors.Join(errs...)
}
