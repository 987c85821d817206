package pods

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/types"
	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// In-place resize (KEP-1287): a running container whose resources in the
// spec differ from those applied to it is resized, once the node admits
// the pod's new requests (Config.ResizeFits). A resource whose
// resizePolicy is RestartContainer restarts the container with the new
// resources; the others are applied to the running container through the
// CRI's UpdateContainerResources, with the cgroup settings the container
// would be created with (resources). What was applied to a container is
// remembered by its ID; a container the worker has not resized since it
// was made (or since the agent started) has the resources it was created
// with, which its annotation records.

// annotationResources records, on a CRI container, the requests and
// limits it was created with.
const annotationResources = "io.cairn.container.resources"

// ResizePending says why the node does not apply a pod's resize yet: the
// reason of the PodResizePending condition (corev1.PodReasonInfeasible,
// which only a change of the spec ends, or corev1.PodReasonDeferred,
// which may fit once other pods are gone) and its message.
type ResizePending struct {
	Reason  string
	Message string
}

// resourcesAnnotation is the annotation that records r on a container.
func resourcesAnnotation(r corev1.ResourceRequirements) string {
	b, _ := json.Marshal(r) // quantities always marshal
	return string(b)
}

// resizedTo is what the worker resized a container of the pod uid to.
type resizedTo struct {
	uid types.UID
	r   corev1.ResourceRequirements
}

// forgetResized forgets what the worker resized pod's containers to.
func (w *Worker) forgetResized(pod *corev1.Pod) {
	w.resized.Range(func(k, v any) bool {
		if v.(resizedTo).uid == pod.UID {
			w.resized.Delete(k)
		}
		return true
	})
}

// applied returns the resources applied to the running CRI container cs
// of c: those the worker last resized it to, else those it was created
// with; c's own for a container made before they were recorded.
func (w *Worker) applied(c *corev1.Container, cs *criv1.ContainerStatus) (corev1.ResourceRequirements, error) {
	if r, ok := w.resized.Load(cs.Id); ok {
		return r.(resizedTo).r, nil
	}
	a, ok := cs.GetAnnotations()[annotationResources]
	if !ok {
		return c.Resources, nil
	}
	var r corev1.ResourceRequirements
	if err := json.Unmarshal([]byte(a), &r); err != nil {
		return r, fmt.Errorf("resources of container %s: %w", cs.Id, err)
	}
	return r, nil
}

// resize resizes the running containers of pod whose resources in the
// spec differ from those applied, as the status st of this sync shows
// them; their CRI containers when the sync began are latest, by name.
// It sets the resources that each running container has in st, and
// st.ResizePending when the node does not admit the resize.
func (w *Worker) resize(ctx context.Context, pod *corev1.Pod, st *Status, latest map[string]*criv1.ContainerStatus, sb sandbox) error {
	type change struct {
		c       *corev1.Container
		cs      *ContainerStatus
		restart bool
	}
	var changes []change
	var errs []error
	each := func(specs []corev1.Container, css []ContainerStatus) {
		for i := range css {
			c, cs := &specs[i], &css[i]
			if cs.State != Running {
				continue
			}
			want := c.Resources
			cs.Resources = &want
			l := latest[c.Name]
			if l == nil || l.Id != cs.ID {
				continue // made in this sync, from the spec
			}
			have, err := w.applied(c, l)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if apiequality.Semantic.DeepEqual(have, want) {
				continue
			}
			cs.Resources = &have
			changes = append(changes, change{c: c, cs: cs, restart: restartsOnResize(c, have, want)})
		}
	}
	each(pod.Spec.InitContainers, st.InitContainers)
	each(pod.Spec.Containers, st.Containers)
	if len(changes) == 0 || len(errs) > 0 {
		return errors.Join(errs...)
	}
	if w.cfg.ResizeFits != nil {
		if reason, msg := w.cfg.ResizeFits(pod); reason != "" {
			st.ResizePending = &ResizePending{Reason: reason, Message: msg}
			return nil
		}
	}
	for _, ch := range changes {
		if ch.restart {
			w.Event(pod, ch.c.Name, corev1.EventTypeNormal, "Killing", "Container %s resize requires restart", ch.c.Name)
			if err := w.stop(ctx, pod, ch.cs.ID, ch.c.Name, sb.ip, GracePeriod(pod)); err != nil {
				errs = append(errs, fmt.Errorf("restart %s to resize it: %w", containerName(pod, ch.c), err))
				continue
			}
			cs, err := w.startContainer(ctx, pod, ch.c, uint32(ch.cs.RestartCount)+1, sb)
			if err != nil {
				errs = append(errs, err)
			}
			if cs.State == Running {
				want := ch.c.Resources
				cs.Resources = &want
			}
			*ch.cs = cs
			continue
		}
		if _, err := w.cfg.Runtime.UpdateContainerResources(ctx, &criv1.UpdateContainerResourcesRequest{
			ContainerId: ch.cs.ID, Linux: containerResources(pod, ch.c),
		}); err != nil {
			st.ResizeError = fmt.Sprintf("resize container %s: %s", ch.c.Name, criMessage(err))
			errs = append(errs, fmt.Errorf("resize %s: %w", containerName(pod, ch.c), err))
			continue
		}
		w.resized.Store(ch.cs.ID, resizedTo{pod.UID, ch.c.Resources})
		want := ch.c.Resources
		ch.cs.Resources = &want
	}
	return errors.Join(errs...)
}

// restartsOnResize says whether c, going from have to want, restarts: a
// resource that changes has the RestartContainer resizePolicy.
func restartsOnResize(c *corev1.Container, have, want corev1.ResourceRequirements) bool {
	for _, p := range c.ResizePolicy {
		if p.RestartPolicy != corev1.RestartContainer {
			continue
		}
		if !have.Requests[p.ResourceName].Equal(want.Requests[p.ResourceName]) ||
			!have.Limits[p.ResourceName].Equal(want.Limits[p.ResourceName]) {
			return true
		}
	}
	return false
}
