package pods

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

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
// whose IP is podIP.
func (w *Worker) mounts(ctx context.Context, pod *corev1.Pod, c *corev1.Container, podIP string) ([]*criv1.Mount, error) {
	var out []*criv1.Mount
	if len(c.VolumeMounts) > 0 {
		if w.cfg.Volumes == nil {
			return nil, errors.New("the node cannot set up volumes")
		}
		paths, err := w.cfg.Volumes.Setup(ctx, pod)
		if err != nil {
			return nil, err
		}
		if out, err = containerMounts(pod, c, paths); err != nil {
			return nil, err
		}
	}
	hosts, err := w.etcHostsMount(pod, c, podIP)
	if hosts != nil {
		out = append(out, hosts)
	}
	return out, err
}

// containerMounts turns c's volumeMounts into CRI mounts of the host
// paths of the pod's volumes. Volumes whose files the node writes from the
// API — projected, configMap, secret, downwardAPI — are read-only in every
// container, as the kubelet mounts them.
func containerMounts(pod *corev1.Pod, c *corev1.Container, paths map[string]string) ([]*criv1.Mount, error) {
	readOnly := map[string]bool{}
	for _, v := range pod.Spec.Volumes {
		readOnly[v.Name] = v.Projected != nil || v.ConfigMap != nil || v.Secret != nil || v.DownwardAPI != nil
	}
	var out []*criv1.Mount
	for _, vm := range c.VolumeMounts {
		host, ok := paths[vm.Name]
		if !ok {
			return nil, fmt.Errorf("volume %q mounted at %s: the pod has no such volume", vm.Name, vm.MountPath)
		}
		if vm.SubPathExpr != "" {
			return nil, fmt.Errorf("volume %q mounted at %s: subPathExpr not supported yet", vm.Name, vm.MountPath)
		}
		if vm.SubPath != "" {
			var err error
			if host, err = subPath(host, vm.SubPath); err != nil {
				return nil, fmt.Errorf("volume %q mounted at %s: %w", vm.Name, vm.MountPath, err)
			}
		}
		out = append(out, &criv1.Mount{ContainerPath: vm.MountPath, HostPath: host, Readonly: vm.ReadOnly || readOnly[vm.Name]})
	}
	return out, nil
}

// subPath is the host path of sub inside the volume at dir, made a
// directory if it does not exist, as the kubelet does. Symbolic links are
// resolved and checked before anything is made and again after, so that
// a link a container left in its volume cannot point the mount, or the
// directory made, outside of it. (A container swapping links at that very
// moment could still race the check; the kubelet's openat walk closes
// that.)
func subPath(dir, sub string) (string, error) {
	if !filepath.IsLocal(sub) {
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
