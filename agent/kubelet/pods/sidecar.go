package pods

import (
	"context"
	"errors"
	"sync"
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
// restart them have all ended, the sidecars are stopped, and the pod ends
// as its app containers did. When sidecars are stopped, with the pod or
// after its app containers ended, it is in the kubelet's order, within
// the one grace period: every preStop hook runs at once, then SIGTERM
// goes to the app containers and to each sidecar, the last one first,
// once the app containers and the sidecars after it are gone.

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
// pod whose statuses are inits, as stopInOrder, and updates their
// statuses.
func (w *Worker) stopSidecars(ctx context.Context, pod *corev1.Pod, inits []ContainerStatus, podIP string, grace time.Duration) error {
	var running []*criv1.Container
	for i, cs := range inits {
		if isSidecar(&pod.Spec.InitContainers[i]) && cs.State == Running {
			running = append(running, &criv1.Container{Id: cs.ID, Metadata: &criv1.ContainerMetadata{Name: cs.Name}, State: criv1.ContainerState_CONTAINER_RUNNING})
		}
	}
	errs := []error{w.stopInOrder(ctx, pod, running, podIP, grace)}
	for i := range inits {
		if cs := &inits[i]; isSidecar(&pod.Spec.InitContainers[i]) && cs.State == Running {
			st, err := w.status(ctx, cs.Name, cs.ID)
			*cs, errs = st, append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// stopInOrder stops the running containers of a sandbox of pod within
// the pod's grace period, as the kubelet does: every preStop hook runs at
// once; then the app containers get SIGTERM, and each sidecar, the last
// one first, once the app containers and the sidecars after it are gone.
func (w *Worker) stopInOrder(ctx context.Context, pod *corev1.Pod, containers []*criv1.Container, podIP string, grace time.Duration) error {
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
	appsGone := make(chan struct{})
	var appErr error
	go func() {
		defer close(appsGone)
		appErr = w.stopAll(ctx, pod, apps, podIP, grace)
	}()
	var wg sync.WaitGroup
	errs := make([]error, len(sidecars))
	turn := appsGone
	for i := len(sidecars) - 1; i > 0; i-- {
		c := sidecars[i]
		if c == nil {
			continue
		}
		gone, after := make(chan struct{}), turn
		wg.Go(func() {
			defer close(gone)
			errs[i] = w.stopAfter(ctx, pod, c.Id, c.GetMetadata().GetName(), podIP, grace, after)
		})
		turn = gone
	}
	wg.Wait()
	<-appsGone
	return errors.Join(append(errs, appErr)...)
}
