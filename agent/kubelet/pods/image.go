package pods

import (
	"context"
	"fmt"
	"strings"

	"github.com/distribution/reference"
	corev1 "k8s.io/api/core/v1"
	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// ensureImage makes the container's image present by its pull policy and
// returns the runtime's reference to it (its image ID).
func (w *Worker) ensureImage(ctx context.Context, pod *corev1.Pod, c *corev1.Container, sandbox *criv1.PodSandboxConfig) (string, error) {
	spec := &criv1.ImageSpec{Image: c.Image}
	policy := pullPolicy(c)
	if policy != corev1.PullAlways {
		st, err := w.Images.ImageStatus(ctx, &criv1.ImageStatusRequest{Image: spec})
		if err != nil {
			return "", fmt.Errorf("status of image %s: %w", c.Image, err)
		}
		if st.Image != nil {
			return st.Image.Id, nil
		}
		if policy == corev1.PullNever {
			return "", fmt.Errorf("%w: %s is not on the node and %s has imagePullPolicy Never", ErrImageNeverPull, c.Image, containerName(pod, c))
		}
	}
	resp, err := w.Images.PullImage(ctx, &criv1.PullImageRequest{Image: spec, SandboxConfig: sandbox})
	if err != nil {
		return "", fmt.Errorf("%w: pull %s for %s: %v", ErrImagePull, c.Image, containerName(pod, c), err)
	}
	return resp.ImageRef, nil
}

// pullPolicy is the container's, or the API server's default when unset:
// Always for an image tagged latest or untagged, IfNotPresent otherwise.
func pullPolicy(c *corev1.Container) corev1.PullPolicy {
	if c.ImagePullPolicy != "" {
		return c.ImagePullPolicy
	}
	ref, err := reference.ParseAnyReference(c.Image)
	if err != nil {
		return corev1.PullAlways
	}
	if _, ok := ref.(reference.Digested); ok {
		return corev1.PullIfNotPresent
	}
	if t, ok := ref.(reference.Tagged); ok && !strings.EqualFold(t.Tag(), "latest") {
		return corev1.PullIfNotPresent
	}
	return corev1.PullAlways
}
