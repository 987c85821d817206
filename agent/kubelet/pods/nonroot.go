package pods

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// verifyNonRoot refuses, as the kubelet does, to make a container that
// must not run as root (runAsNonRoot, the container's or else the pod's)
// but would: its runAsUser is 0, or, with none, its image's user is uid 0,
// none at all, or a name whose uid cannot be known before it runs. image
// is the runtime's reference to the pulled image.
func (w *Worker) verifyNonRoot(ctx context.Context, pod *corev1.Pod, c *corev1.Container, image string) error {
	var nonRoot *bool
	var uid *int64
	if psc := pod.Spec.SecurityContext; psc != nil {
		nonRoot, uid = psc.RunAsNonRoot, psc.RunAsUser
	}
	if sc := c.SecurityContext; sc != nil {
		if sc.RunAsNonRoot != nil {
			nonRoot = sc.RunAsNonRoot
		}
		if sc.RunAsUser != nil {
			uid = sc.RunAsUser
		}
	}
	if nonRoot == nil || !*nonRoot {
		return nil
	}
	who := fmt.Sprintf("(pod: %q, container: %s)", fmt.Sprintf("%s_%s(%s)", pod.Name, pod.Namespace, pod.UID), c.Name)
	if uid != nil {
		if *uid == 0 {
			return fmt.Errorf("container's runAsUser breaks non-root policy %s", who)
		}
		return nil
	}
	st, err := w.cfg.Images.ImageStatus(ctx, &criv1.ImageStatusRequest{Image: &criv1.ImageSpec{Image: image}})
	if err != nil {
		return fmt.Errorf("status of image %s, to check its user is not root: %w", image, err)
	}
	switch img := st.GetImage(); {
	case img.GetUid() != nil && img.GetUid().GetValue() != 0:
		return nil
	case img.GetUid() == nil && img.GetUsername() != "":
		return fmt.Errorf("container has runAsNonRoot and image has non-numeric user (%s), cannot verify user is non-root %s", img.GetUsername(), who)
	}
	return fmt.Errorf("container has runAsNonRoot and image will run as root %s", who)
}
