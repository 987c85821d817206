package pods

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cairn-os/cairn/agent/kubelet/handler"
)

// Lifecycle hooks and the stopping of containers. A postStart hook runs
// right after its container started; the container counts as running
// only once the hook returned, and a failing hook stops the container,
// which then restarts as the pod's restartPolicy says. A preStop hook runs
// before a container is stopped — the pod deleted, or a probe failing —
// within the grace period, and the stop gets what is left of it, at least
// minStopGrace.

// minStopGrace is what a container gets between SIGTERM and SIGKILL when
// its preStop hook used up the grace period, as with the kubelet.
const minStopGrace = 2 * time.Second

// ReasonPostStartHookError is why a container stopped by its failing
// postStart hook waits.
const ReasonPostStartHookError = "PostStartHookError"

// runHook runs h in or against the running container id of c.
func (w *Worker) runHook(ctx context.Context, pod *corev1.Pod, c *corev1.Container, id, podIP string, h *corev1.LifecycleHandler, timeout time.Duration) error {
	if h.Exec == nil && h.HTTPGet == nil && h.Sleep == nil {
		return errors.New("hook has no exec, httpGet or sleep action")
	}
	host := podIP
	if host == "" {
		host = pod.Status.PodIP // the node's, on the host network
	}
	target := handler.Target{Container: c, ContainerID: id, Host: host}
	return handler.Run(ctx, w.cfg.Runtime, handler.FromHook(h), timeout, target)
}

// postStart runs c's postStart hook, if any, in the container id that
// just started; if it fails the container is stopped.
func (w *Worker) postStart(ctx context.Context, pod *corev1.Pod, c *corev1.Container, id, podIP string) error {
	if c.Lifecycle == nil || c.Lifecycle.PostStart == nil {
		return nil
	}
	err := w.runHook(ctx, pod, c, id, podIP, c.Lifecycle.PostStart, 0)
	if err == nil {
		return nil
	}
	w.Event(pod, c.Name, corev1.EventTypeWarning, "FailedPostStartHook", "PostStartHook failed: %v", err)
	err = fmt.Errorf("%s: postStart hook: %w", containerName(pod, c), err)
	if stopErr := w.stop(ctx, pod, id, c.Name, podIP, GracePeriod(pod)); stopErr != nil {
		err = errors.Join(err, stopErr)
	}
	return err
}

// StopUnhealthy stops the running container id of pod, named name, that
// failed its liveness or startup probe: its preStop hook first, then
// SIGTERM and, after what is left of grace, SIGKILL. The container is
// then restarted whatever its exit code, unless the pod's restartPolicy
// is Never.
func (w *Worker) StopUnhealthy(ctx context.Context, pod *corev1.Pod, name, id string, grace time.Duration) error {
	w.unhealthy.Store(id, true)
	ip, err := w.sandboxIP(ctx, pod)
	if err != nil {
		return err
	}
	return w.stop(ctx, pod, id, name, ip, grace)
}

// stoppedUnhealthy says whether the container id was stopped for failing
// a probe.
func (w *Worker) stoppedUnhealthy(id string) bool {
	_, ok := w.unhealthy.Load(id)
	return ok
}

// stop runs the preStop hook of the container id, named name, of pod, if
// it has one and still runs, and then stops it within what is left of
// grace.
func (w *Worker) stop(ctx context.Context, pod *corev1.Pod, id, name, podIP string, grace time.Duration) error {
	return w.stopAfter(ctx, pod, id, name, podIP, grace, nil)
}

// stopAfter is stop, whose SIGTERM, after the preStop hook, waits for
// turn, if not nil, to be closed, within the grace period: a sidecar's
// turn comes once the containers that stop before it are gone.
func (w *Worker) stopAfter(ctx context.Context, pod *corev1.Pod, id, name, podIP string, grace time.Duration, turn <-chan struct{}) error {
	deadline := time.Now().Add(grace)
	w.Event(pod, name, corev1.EventTypeNormal, "Killing", "Stopping container %s", name)
	var hookErr error
	if c := specContainer(pod, name); c != nil && c.Lifecycle != nil && c.Lifecycle.PreStop != nil {
		hctx, cancel := context.WithDeadline(ctx, deadline)
		if err := w.runHook(hctx, pod, c, id, podIP, c.Lifecycle.PreStop, grace); err != nil {
			w.Event(pod, name, corev1.EventTypeWarning, "FailedPreStopHook", "PreStopHook failed: %v", err)
			hookErr = fmt.Errorf("%s: preStop hook: %w", containerName(pod, c), err)
		}
		cancel()
	}
	if turn != nil && grace > 0 {
		t := time.NewTimer(time.Until(deadline))
		select {
		case <-turn:
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
	}
	left := max(time.Until(deadline), minStopGrace)
	if grace == 0 {
		left = 0 // deletion forced: no grace at all
	}
	_, err := w.cfg.Runtime.StopContainer(ctx, &criv1.StopContainerRequest{ContainerId: id, Timeout: int64(left.Round(time.Second) / time.Second)})
	if err != nil {
		return errors.Join(hookErr, fmt.Errorf("stop container %s of pod %s/%s: %w", name, pod.Namespace, pod.Name, err))
	}
	return hookErr
}

// stopAll stops the running containers of a sandbox at once, as the
// kubelet does: the grace period is the pod's, not each container's.
func (w *Worker) stopAll(ctx context.Context, pod *corev1.Pod, containers []*criv1.Container, podIP string, grace time.Duration) error {
	var wg sync.WaitGroup
	errs := make([]error, len(containers))
	for i, c := range containers {
		w.unhealthy.Delete(c.Id)
		if c.State != criv1.ContainerState_CONTAINER_RUNNING {
			continue
		}
		wg.Go(func() { errs[i] = w.stop(ctx, pod, c.Id, c.GetMetadata().GetName(), podIP, grace) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// sandboxIP is the IP of pod's ready sandbox; empty if it has none, or
// is on the host network.
func (w *Worker) sandboxIP(ctx context.Context, pod *corev1.Pod) (string, error) {
	sandboxes, err := w.sandboxes(ctx, pod)
	if err != nil {
		return "", err
	}
	for _, sb := range sandboxes {
		if sb.State == criv1.PodSandboxState_SANDBOX_READY {
			return w.podIP(ctx, pod, sb.Id)
		}
	}
	return "", nil
}

// podIP is the primary IP of pod's sandbox id; empty on the host network.
func (w *Worker) podIP(ctx context.Context, pod *corev1.Pod, id string) (string, error) {
	if pod.Spec.HostNetwork {
		return "", nil
	}
	st, err := w.cfg.Runtime.PodSandboxStatus(ctx, &criv1.PodSandboxStatusRequest{PodSandboxId: id})
	if err != nil {
		return "", fmt.Errorf("status of sandbox %s of pod %s/%s: %w", id, pod.Namespace, pod.Name, err)
	}
	return st.GetStatus().GetNetwork().GetIp(), nil
}

// GracePeriod is the pod's termination grace period: what its deletion
// asked for, else its spec's, else the API's default of 30 s.
func GracePeriod(pod *corev1.Pod) time.Duration {
	switch {
	case pod.DeletionGracePeriodSeconds != nil:
		return time.Duration(*pod.DeletionGracePeriodSeconds) * time.Second
	case pod.Spec.TerminationGracePeriodSeconds != nil:
		return time.Duration(*pod.Spec.TerminationGracePeriodSeconds) * time.Second
	}
	return 30 * time.Second
}

// specContainer is the container of pod's spec named name, init
// containers included; nil if there is none.
func specContainer(pod *corev1.Pod, name string) *corev1.Container {
	for _, cs := range [][]corev1.Container{pod.Spec.Containers, pod.Spec.InitContainers} {
		for i := range cs {
			if cs[i].Name == name {
				return &cs[i]
			}
		}
	}
	return nil
}
