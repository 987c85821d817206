package pods

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Stop stops every running container of pod as Terminate does, preStop
// hooks and grace included, and then its sandboxes, but removes nothing:
// a pod that ended for good on the node (its activeDeadlineSeconds
// passed) shows its containers' ends, and keeps their logs, until it is
// deleted. Its caller must not Sync the pod again, which would start it
// anew.
func (w *Worker) Stop(ctx context.Context, pod *corev1.Pod, grace time.Duration) error {
	sandboxes, err := w.sandboxes(ctx, pod)
	if err != nil {
		return err
	}
	var errs []error
	for _, sb := range sandboxes {
		errs = append(errs, w.stopSandbox(ctx, pod, sb, grace))
	}
	return errors.Join(errs...)
}

// stopSandbox stops the running containers of sb, one of pod's
// sandboxes, in order and within grace, and then sb itself.
func (w *Worker) stopSandbox(ctx context.Context, pod *corev1.Pod, sb *criv1.PodSandbox, grace time.Duration) error {
	errStop := w.stopContainers(ctx, pod, sb, grace)
	if _, err := w.cfg.Runtime.StopPodSandbox(ctx, &criv1.StopPodSandboxRequest{PodSandboxId: sb.Id}); err != nil {
		return errors.Join(errStop, fmt.Errorf("stop sandbox %s of pod %s/%s: %w", sb.Id, pod.Namespace, pod.Name, err))
	}
	return errStop
}

// stopContainers stops the running containers of sb, one of pod's
// sandboxes, in order and within grace.
func (w *Worker) stopContainers(ctx context.Context, pod *corev1.Pod, sb *criv1.PodSandbox, grace time.Duration) error {
	resp, err := w.cfg.Runtime.ListContainers(ctx, &criv1.ListContainersRequest{
		Filter: &criv1.ContainerFilter{PodSandboxId: sb.Id},
	})
	if err != nil {
		return fmt.Errorf("list containers of sandbox %s: %w", sb.Id, err)
	}
	var ip string // for httpGet preStop hooks
	if sb.State == criv1.PodSandboxState_SANDBOX_READY {
		ip, _ = w.podIP(ctx, pod, sb.Id)
	}
	return w.stopInOrder(ctx, pod, resp.Containers, ip, grace)
}
