package pods

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/distribution/reference"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Volumes keeps pods' volumes on the host (agent/kubelet/volumes).
type Volumes interface {
	// Setup makes the pod's volumes ready, if they are not, and returns
	// the host path of each by the volume's name. Its error names the
	// volume that failed and why, for the container's waiting message.
	Setup(ctx context.Context, pod *corev1.Pod) (map[string]string, error)
	// Refresh renews what is due of the pod's volumes: tokens before they
	// expire, ConfigMaps and Secrets that changed.
	Refresh(ctx context.Context, pod *corev1.Pod) error
	// TearDown removes the pod's volumes once its containers are gone.
	TearDown(uid types.UID) error
	// Pods lists the pods that have volumes.
	Pods() ([]types.UID, error)
}

// mounts sets up the pod's volumes if c mounts any and returns c's CRI
// mounts of them, and of the pod's hosts file (etcHostsMount) in the pod
// whose IP is podIP, and c's CRI devices of the raw block volumes in its
// volumeDevices; env is c's environment, for subPathExpr.
func (w *Worker) mounts(ctx context.Context, pod *corev1.Pod, c *corev1.Container, podIP string, env []*criv1.KeyValue) ([]*criv1.Mount, []*criv1.Device, error) {
	var out []*criv1.Mount
	var devices []*criv1.Device
	if len(c.VolumeMounts) > 0 || len(c.VolumeDevices) > 0 {
		if w.cfg.Volumes == nil {
			return nil, nil, errors.New("the node cannot set up volumes")
		}
		paths, err := w.cfg.Volumes.Setup(ctx, pod)
		if err != nil {
			// The kubelet's FailedMount event, one for each volume.
			errs := []error{err}
			if j, ok := err.(interface{ Unwrap() []error }); ok {
				errs = j.Unwrap()
			}
			for _, e := range errs {
				w.Event(pod, "", corev1.EventTypeWarning, "FailedMount", "%v", e)
			}
			return nil, nil, err
		}
		if out, err = containerMounts(pod, c, paths, env); err != nil {
			return nil, nil, err
		}
		if devices, err = containerDevices(c, paths); err != nil {
			return nil, nil, err
		}
	}
	hosts, err := w.etcHostsMount(pod, c, podIP)
	if hosts != nil {
		out = append(out, hosts)
	}
	return out, devices, err
}

// containerDevices turns c's volumeDevices into CRI devices: the block
// device that the pod's volume (a claim of volumeMode Block) is on the
// host, at the path c names, readable and writable, as the kubelet maps
// them.
func containerDevices(c *corev1.Container, paths map[string]string) ([]*criv1.Device, error) {
	var out []*criv1.Device
	for _, d := range c.VolumeDevices {
		p, ok := paths[d.Name]
		if !ok {
			return nil, fmt.Errorf("volumeDevice %q of container %q: no volume of that name", d.Name, c.Name)
		}
		out = append(out, &criv1.Device{ContainerPath: d.DevicePath, HostPath: p, Permissions: "mrw"})
	}
	return out, nil
}

// containerMounts turns c's volumeMounts into CRI mounts of the host
// paths of the pod's volumes. Volumes whose files the node writes from the
// API — projected, configMap, secret, downwardAPI — are read-only in every
// container, as the kubelet mounts them. A subPathExpr is expanded with
// c's environment env, then taken as a subPath. An image volume is the
// runtime's mount of its image (pulled by ensureImage), read-only.
func containerMounts(pod *corev1.Pod, c *corev1.Container, paths map[string]string, env []*criv1.KeyValue) ([]*criv1.Mount, error) {
	readOnly := map[string]bool{}
	images := map[string]string{}
	for _, v := range pod.Spec.Volumes {
		readOnly[v.Name] = v.Projected != nil || v.ConfigMap != nil || v.Secret != nil || v.DownwardAPI != nil
		if v.Image != nil {
			images[v.Name] = v.Image.Reference
		}
	}
	privileged := c.SecurityContext != nil && c.SecurityContext.Privileged != nil && *c.SecurityContext.Privileged
	var out []*criv1.Mount
	for _, vm := range c.VolumeMounts {
		prop, err := propagation(vm.MountPropagation, privileged)
		if err != nil {
			return nil, fmt.Errorf("volume %q mounted at %s: %w", vm.Name, vm.MountPath, err)
		}
		sub := vm.SubPath
		if vm.SubPathExpr != "" {
			if sub, err = expandSubPath(vm.SubPathExpr, env); err != nil {
				return nil, fmt.Errorf("volume %q mounted at %s: %w", vm.Name, vm.MountPath, err)
			}
		}
		if image, ok := images[vm.Name]; ok {
			m, err := imageMount(image, vm.MountPath, sub)
			if err != nil {
				return nil, fmt.Errorf("volume %q mounted at %s: %w", vm.Name, vm.MountPath, err)
			}
			m.Propagation = prop
			out = append(out, m)
			continue
		}
		host, ok := paths[vm.Name]
		if !ok {
			return nil, fmt.Errorf("volume %q mounted at %s: the pod has no such volume", vm.Name, vm.MountPath)
		}
		if sub != "" {
			var err error
			if host, err = subPath(host, sub); err != nil {
				return nil, fmt.Errorf("volume %q mounted at %s: %w", vm.Name, vm.MountPath, err)
			}
		}
		out = append(out, &criv1.Mount{ContainerPath: vm.MountPath, HostPath: host, Readonly: vm.ReadOnly || readOnly[vm.Name], Propagation: prop})
	}
	return out, nil
}

// imageMount is the CRI mount at path of the image volume of image: the
// runtime finds the image by the name it pulled it as, and mounts it, or
// its directory sub, read-only.
func imageMount(image, path, sub string) (*criv1.Mount, error) {
	if sub != "" && !filepath.IsLocal(sub) {
		return nil, fmt.Errorf("subPath %q: not a relative path inside the volume", sub)
	}
	ref, err := reference.ParseDockerRef(image)
	if err != nil {
		return nil, fmt.Errorf("image %q: %w", image, err)
	}
	return &criv1.Mount{ContainerPath: path, Image: &criv1.ImageSpec{Image: ref.String()}, ImageSubPath: sub, Readonly: true}, nil
}

// propagation is the CRI's mount propagation for a volumeMount's, as the
// kubelet translates it; Bidirectional only for a privileged container, as
// the API server validates it.
func propagation(mode *corev1.MountPropagationMode, privileged bool) (criv1.MountPropagation, error) {
	if mode == nil {
		return criv1.MountPropagation_PROPAGATION_PRIVATE, nil
	}
	switch *mode {
	case corev1.MountPropagationNone:
		return criv1.MountPropagation_PROPAGATION_PRIVATE, nil
	case corev1.MountPropagationHostToContainer:
		return criv1.MountPropagation_PROPAGATION_HOST_TO_CONTAINER, nil
	case corev1.MountPropagationBidirectional:
		if !privileged {
			return 0, errors.New("Bidirectional mount propagation is available only to privileged containers")
		}
		return criv1.MountPropagation_PROPAGATION_BIDIRECTIONAL, nil
	}
	return 0, fmt.Errorf("invalid MountPropagation mode: %q", *mode)
}

// subPath is the host path of sub inside the volume at dir, made a
// directory if it does not exist, as the kubelet does; sub is relative
// and has no .. (the API checks a subPath so, not what a subPathExpr
// expands to). Symbolic links are
// resolved and checked before anything is made and again after, so that
// a link a container left in its volume cannot point the mount, or the
// directory made, outside of it. (A container swapping links at that very
// moment could still race the check; the kubelet's openat walk closes
// that.)
func subPath(dir, sub string) (string, error) {
	if !filepath.IsLocal(sub) || slices.Contains(strings.Split(sub, "/"), "..") {
		return "", fmt.Errorf("subPath %q: not a relative path inside the volume", sub)
	}
	root, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return "", err
	}
	p := filepath.Join(dir, sub)
	existing := p
	for {
		if _, err := os.Lstat(existing); !errors.Is(err, fs.ErrNotExist) {
			break
		}
		existing = filepath.Dir(existing)
	}
	if _, err := inside(root, existing); err != nil {
		return "", fmt.Errorf("subPath %q: %w", sub, err)
	}
	if existing != p {
		if err := os.MkdirAll(p, 0o755); err != nil {
			return "", fmt.Errorf("subPath %q: %w", sub, err)
		}
	}
	real, err := inside(root, p)
	if err != nil {
		return "", fmt.Errorf("subPath %q: %w", sub, err)
	}
	return real, nil
}

// expandSubPath is the subPath that expr names: each $(VAR) replaced by
// the value of the variable VAR of env, $$ a literal $, as the kubelet
// expands it. A reference to a variable that env lacks, or whose value is
// empty, is an error, as with the kubelet: the container waits
// (CreateContainerConfigError) and a later attempt, with a new
// environment (a downward API annotation set meanwhile), may succeed.
func expandSubPath(expr string, env []*criv1.KeyValue) (string, error) {
	vars := make(map[string]string, len(env))
	for _, kv := range env {
		vars[kv.Key] = string(kv.Value)
	}
	var missing []string
	out := expand(expr, func(name string) (string, bool) {
		v := vars[name]
		if v == "" && !slices.Contains(missing, name) {
			missing = append(missing, name)
		}
		return v, true
	})
	if len(missing) > 0 {
		return "", fmt.Errorf("subPathExpr %q: no value for %s", expr, strings.Join(missing, ", "))
	}
	return out, nil
}

// inside resolves the links of p and checks that it stays under root, a
// path without links.
func inside(root, p string) (string, error) {
	real, err := filepath.EvalSymlinks(p)
	if err != nil {
		return "", err
	}
	if real != root && !strings.HasPrefix(real, root+string(filepath.Separator)) {
		return "", errors.New("leads outside the volume")
	}
	return real, nil
}
