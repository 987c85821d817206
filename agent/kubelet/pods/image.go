package pods

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/distribution/reference"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Image pulls. A pull that fails makes the next pull of that image for
// that pod wait, the kubelet's image pull backoff: BackoffInitial after
// the first failure, twice as long after each further one, up to
// BackoffMax; a failure more than twice BackoffMax after the one before
// starts over. The worker keeps the failures in memory (Worker.pulls)
// until the pod is killed.

// pullKey names the pulls of an image for a pod.
type pullKey struct {
	uid   types.UID
	image string
}

// pullFailure is the latest failed pull of a pullKey.
type pullFailure struct {
	at    time.Time
	delay time.Duration // until the next pull
	err   string
	told  bool // the BackOff event was recorded
}

// ensureImage makes the container's image present by its pull policy and
// returns the runtime's reference to it (its image ID), after the images
// of the image volumes it mounts, as the kubelet pulls those first. Its
// errors are waitErrors; while the image's pulls back off,
// ErrImagePullBackOff with the time they may resume.
func (w *Worker) ensureImage(ctx context.Context, pod *corev1.Pod, c *corev1.Container, sandbox *criv1.PodSandboxConfig) (string, time.Time, error) {
	for _, v := range volumeImages(pod, c) {
		if _, until, err := w.ensureImage(ctx, pod, v, sandbox); err != nil {
			return "", until, err
		}
	}
	if _, err := reference.ParseNormalizedNamed(c.Image); err != nil {
		msg := fmt.Sprintf("Failed to apply default image tag %q: couldn't parse image name %q: %v", c.Image, c.Image, err)
		w.Event(pod, c.Name, corev1.EventTypeWarning, "InspectFailed", "%s", msg)
		return "", time.Time{}, &waitError{ErrInvalidImageName, msg}
	}
	spec := &criv1.ImageSpec{Image: c.Image}
	policy := pullPolicy(c)
	if policy != corev1.PullAlways {
		st, err := w.cfg.Images.ImageStatus(ctx, &criv1.ImageStatusRequest{Image: spec})
		if err != nil {
			msg := fmt.Sprintf("Failed to inspect image %q: %s", c.Image, criMessage(err))
			w.Event(pod, c.Name, corev1.EventTypeWarning, "InspectFailed", "%s", msg)
			return "", time.Time{}, &waitError{ErrImageInspect, msg}
		}
		if st.Image != nil {
			w.Event(pod, c.Name, corev1.EventTypeNormal, "Pulled", "Container image %q already present on machine", c.Image)
			return st.Image.Id, time.Time{}, nil
		}
		if policy == corev1.PullNever {
			msg := fmt.Sprintf("Container image %q is not present with pull policy of Never", c.Image)
			w.Event(pod, c.Name, corev1.EventTypeWarning, "ErrImageNeverPull", "%s", msg)
			return "", time.Time{}, &waitError{ErrImageNeverPull, msg}
		}
	}
	key := pullKey{pod.UID, c.Image}
	now := w.now()
	if v, ok := w.pulls.Load(key); ok {
		f := v.(pullFailure)
		if until := f.at.Add(f.delay); now.Before(until) {
			if !f.told {
				f.told = true
				w.pulls.Store(key, f)
				w.Event(pod, c.Name, corev1.EventTypeNormal, "BackOff", "Back-off pulling image %q", c.Image)
				w.Event(pod, c.Name, corev1.EventTypeWarning, "Failed", "Error: %s", ErrImagePullBackOff)
			}
			return "", until, &waitError{ErrImagePullBackOff, fmt.Sprintf("Back-off pulling image %q: %s: %s", c.Image, ErrImagePull, f.err)}
		}
	}
	w.Event(pod, c.Name, corev1.EventTypeNormal, "Pulling", "Pulling image %q", c.Image)
	start := time.Now()
	ref, err := w.pull(ctx, pod, c, spec, sandbox)
	if err != nil {
		f := pullFailure{at: now, delay: BackoffInitial, err: err.Error()}
		if v, ok := w.pulls.Load(key); ok {
			if prev := v.(pullFailure); now.Sub(prev.at) <= 2*BackoffMax {
				f.delay = min(2*prev.delay, BackoffMax)
			}
		}
		w.pulls.Store(key, f)
		w.Event(pod, c.Name, corev1.EventTypeWarning, "Failed", "Failed to pull image %q: %v", c.Image, err)
		return "", time.Time{}, &waitError{ErrImagePull, err.Error()}
	}
	w.pulls.Delete(key)
	w.Event(pod, c.Name, corev1.EventTypeNormal, "Pulled", "Successfully pulled image %q in %v", c.Image, time.Since(start).Round(time.Millisecond))
	return ref, time.Time{}, nil
}

// pull pulls the image with each credential of the pod's pull secrets
// that matches its registry, the most specific first, then without any,
// until one pull succeeds.
func (w *Worker) pull(ctx context.Context, pod *corev1.Pod, c *corev1.Container, spec *criv1.ImageSpec, sandbox *criv1.PodSandboxConfig) (string, error) {
	creds := w.pullCredentials(ctx, pod, c)
	var msgs []string
	for _, auth := range append(creds, nil) {
		resp, err := w.cfg.Images.PullImage(ctx, &criv1.PullImageRequest{Image: spec, Auth: auth, SandboxConfig: sandbox})
		if err == nil {
			return resp.ImageRef, nil
		}
		msg := criMessage(err)
		switch {
		case auth != nil:
			msg = "with the credentials of " + auth.Username + ": " + msg
		case len(creds) > 0:
			msg = "anonymously: " + msg
		}
		msgs = append(msgs, msg)
		if ctx.Err() != nil {
			break
		}
	}
	return "", errors.New(strings.Join(msgs, "; "))
}

// pullCredentials are the credentials of the pod's imagePullSecrets for
// c's image. A secret that cannot be read or parsed is told as an event
// and passed over, as the pull may still succeed without it.
func (w *Worker) pullCredentials(ctx context.Context, pod *corev1.Pod, c *corev1.Container) []*criv1.AuthConfig {
	if len(pod.Spec.ImagePullSecrets) == 0 {
		return nil
	}
	var secrets []*corev1.Secret
	var missing []string
	for _, ref := range pod.Spec.ImagePullSecrets {
		var s *corev1.Secret
		err := errors.New("the node has no API access to read it")
		if w.cfg.Refs != nil {
			s, err = w.cfg.Refs.Secret(ctx, pod.Namespace, ref.Name)
		}
		if err != nil {
			missing = append(missing, fmt.Sprintf("%s (%v)", ref.Name, err))
			continue
		}
		secrets = append(secrets, s)
	}
	if len(missing) > 0 {
		w.Event(pod, "", corev1.EventTypeWarning, "FailedToRetrieveImagePullSecret",
			"Unable to retrieve some image pull secrets (%s); attempting to pull the image may not succeed.", strings.Join(missing, ", "))
	}
	keys, err := parseKeyring(secrets)
	if err != nil {
		w.Event(pod, "", corev1.EventTypeWarning, "FailedToRetrieveImagePullSecret", "Some image pull secrets are not valid: %v", err)
	}
	return keys.lookup(c.Image)
}

// volumeImages are the images of the image volumes that c mounts, each as
// a container to pull for, with no name, so that its events are about the
// pod, as the kubelet's are.
func volumeImages(pod *corev1.Pod, c *corev1.Container) []*corev1.Container {
	var out []*corev1.Container
	for _, v := range pod.Spec.Volumes {
		if v.Image == nil || !slices.ContainsFunc(c.VolumeMounts, func(vm corev1.VolumeMount) bool { return vm.Name == v.Name }) {
			continue
		}
		out = append(out, &corev1.Container{Image: v.Image.Reference, ImagePullPolicy: v.Image.PullPolicy})
	}
	return out
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
