// Package volumes prepares the volumes of a node's pods on the host, for
// the container runtime to bind-mount: the kube-api-access projected
// volume the API server adds to every Pod (a service-account token from
// TokenRequest, the kube-root-ca.crt ConfigMap, the namespace) and the
// volumes made of the same parts — projected, configMap, secret and
// downwardAPI volumes — plus emptyDir and hostPath, whose path it checks
// against the volume's type (or makes, for DirectoryOrCreate and
// FileOrCreate) and returns as it is: the host's file is mounted, never
// copied nor removed. An image volume has nothing on the host: the worker
// pulls its image and the runtime mounts it (agent/kubelet/pods).
//
// A volume lives in Root/<pod UID>/volumes/<plugin>/<name>, its files
// written atomically (see writeAtomic) and rewritten only when their
// content changes. Setup makes a pod's volumes the first time and returns
// their paths; Refresh, called now and then by the pod sync loop, renews
// tokens before they expire and reads ConfigMaps, Secrets and the pod's
// metadata again every Resync; TearDown removes a pod's directory once
// its containers are gone.
//
//	m := &volumes.Manager{Root: "/var/lib/cairn/kubelet/pods", Client: nodeClient}
//	paths, err := m.Setup(ctx, pod) // paths["kube-api-access-xyz"] = ".../kubernetes.io~projected/kube-api-access-xyz"
//
// Everything goes through the node's client, as the Node authorizer
// allows: tokens of the service accounts of pods bound to the node, and
// the ConfigMaps and Secrets those pods refer to.
//
// A volume that cannot be set up is an error in the words of the
// kubelet's FailedMount event: MountVolume.SetUp failed for volume "x" :
// hostPath type check failed: /run/x.sock is not a socket file, it's a
// Directory.
//
// Claims of CSI PersistentVolumes, generic ephemeral volumes and inline
// CSI volumes are mounted by Manager.CSI through their drivers.
//
// With Tmpfs, secret and projected volumes and emptyDirs of medium Memory
// are each a tmpfs, never on the node's disk.
//
// A pod's fsGroup owns the files of its emptyDir, configMap, secret,
// downwardAPI and projected volumes, and of its CSI volumes as their
// driver's fsGroupPolicy says, as the kubelet gives them to it.
//
// Not yet here: other volume types and clusterTrustBundle sources.
package volumes

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// Timings: DefaultResync is Manager.Resync's default; Refresh tries
// again retryAfter after a failure; each call to the API server may take
// requestTimeout.
const (
	DefaultResync  = time.Minute
	retryAfter     = 10 * time.Second
	requestTimeout = 10 * time.Second
)

// Manager prepares pods' volumes. Its fields are set before the first
// call and not changed after; its methods may be called from many
// goroutines.
type Manager struct {
	// Root holds a directory per pod, named by its UID.
	Root string
	// Client is the node's.
	Client kubernetes.Interface
	// Resync is how often Refresh reads ConfigMaps, Secrets and the pod's
	// metadata again; DefaultResync if 0.
	Resync time.Duration
	// Now is the clock of token renewals; time.Now if nil.
	Now func() time.Time
	// Tmpfs keeps the volumes that the kubelet keeps in memory on a
	// tmpfs of their own: secret and projected volumes, emptyDirs of
	// medium Memory (of at most their sizeLimit). Without it (tests as a
	// user) they are directories on the node's disk.
	Tmpfs bool
	// CSI, if set, mounts the volumes of CSI drivers: claims of CSI
	// PersistentVolumes, generic ephemeral volumes, inline CSI volumes
	// (agent/csi). Its TearDown runs first in TearDown, on every pod.
	CSI CSI
	// Node, if set, returns the Node, whose allocatable a
	// resourceFieldRef shows for a limit that a container does not set;
	// without it, such a limit cannot be shown.
	Node func(ctx context.Context) (*corev1.Node, error)

	mu   sync.Mutex
	pods map[types.UID]*podVolumes
}

// CSI mounts volumes through CSI drivers (agent/csi.Plugins).
type CSI interface {
	// SetUp mounts v for pod, through client, and returns its path and
	// whether the pod's fsGroup is to own its files.
	SetUp(ctx context.Context, client kubernetes.Interface, pod *corev1.Pod, v *corev1.Volume) (path string, fsGroup bool, err error)
	// Expand grows on the node the volume v that SetUp mounted for pod,
	// if the cluster grew its claim since.
	Expand(ctx context.Context, client kubernetes.Interface, pod *corev1.Pod, v *corev1.Volume) error
	// TearDown unmounts the volumes of the pod uid that SetUp mounted.
	TearDown(ctx context.Context, uid types.UID) error
}

// isCSI reports whether v is mounted through a CSI driver.
func isCSI(v *corev1.Volume) bool {
	return v.PersistentVolumeClaim != nil || v.Ephemeral != nil || v.CSI != nil
}

// podVolumes is what the manager knows of one pod's volumes.
type podVolumes struct {
	mu     sync.Mutex // one writer per pod
	paths  map[string]string
	tokens map[string]*token // by volume name and path
	next   time.Time         // when Refresh writes the volumes again
}

func (m *Manager) now() time.Time {
	if m.Now != nil {
		return m.Now()
	}
	return time.Now()
}

func (m *Manager) state(uid types.UID) *podVolumes {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.pods == nil {
		m.pods = map[types.UID]*podVolumes{}
	}
	pv := m.pods[uid]
	if pv == nil {
		pv = &podVolumes{tokens: map[string]*token{}}
		m.pods[uid] = pv
	}
	return pv
}

// Setup makes the pod's volumes, unless it did already, and returns the
// host path of each by the volume's name. A volume of a type not supported
// yet, or whose ConfigMap, Secret or token cannot be had, is an error that
// names it.
func (m *Manager) Setup(ctx context.Context, pod *corev1.Pod) (map[string]string, error) {
	return m.ensure(ctx, pod, false)
}

// Refresh writes the pod's volumes again if they are due: a token is to
// be renewed, or Resync has passed since they were last written. It also
// sets up the volumes of a pod that this manager has not set up: one whose
// containers were started before the agent restarted.
func (m *Manager) Refresh(ctx context.Context, pod *corev1.Pod) error {
	_, err := m.ensure(ctx, pod, true)
	return err
}

// ensure writes the pod's volumes if Setup has not yet, or, for Refresh,
// if they are due.
func (m *Manager) ensure(ctx context.Context, pod *corev1.Pod, refresh bool) (map[string]string, error) {
	pv := m.state(pod.UID)
	pv.mu.Lock()
	defer pv.mu.Unlock()
	now := m.now()
	if refresh && now.Before(pv.next) || !refresh && pv.paths != nil {
		return maps.Clone(pv.paths), nil
	}
	paths, next, err := m.write(ctx, pod, pv, now)
	if err != nil {
		// Refresh tries again after a while; Setup, which a container
		// waits for, whenever it is called.
		pv.next = now.Add(retryAfter)
		return nil, err
	}
	pv.paths, pv.next = paths, next
	return maps.Clone(paths), nil
}

// write writes every volume of pod and returns their paths and when they
// are next due.
func (m *Manager) write(ctx context.Context, pod *corev1.Pod, pv *podVolumes, now time.Time) (map[string]string, time.Time, error) {
	resync := m.Resync
	if resync == 0 {
		resync = DefaultResync
	}
	next := now.Add(resync)
	paths := map[string]string{}
	var errs []error
	for i := range pod.Spec.Volumes {
		v := &pod.Spec.Volumes[i]
		switch {
		case v.Image != nil:
			// Nothing on the host: the runtime mounts the image
			// (pods.containerMounts).
			continue
		case v.HostPath != nil:
			// Checked, or made, once: the kubelet does not check
			// again a path that its containers may have changed.
			p, ok := pv.paths[v.Name]
			if !ok {
				var err error
				if p, err = hostPath(v.HostPath); err != nil {
					errs = append(errs, setupError(v.Name, err))
					continue
				}
			}
			paths[v.Name] = p
			continue
		case isCSI(v) && m.CSI != nil && m.Client != nil:
			// Mounted once, the driver keeps it; grown on the node
			// once the cluster grew its claim.
			p, ok := pv.paths[v.Name]
			if ok {
				if err := m.CSI.Expand(ctx, m.Client, pod, v); err != nil {
					errs = append(errs, err)
					continue
				}
			} else {
				var fsGroup bool
				var err error
				p, fsGroup, err = m.CSI.SetUp(ctx, m.Client, pod, v)
				if err == nil && fsGroup {
					err = setOwnership(p, pod, false)
				}
				if err != nil {
					errs = append(errs, setupError(v.Name, err))
					continue
				}
			}
			paths[v.Name] = p
			continue
		}
		plugin, err := pluginOf(v)
		if err != nil {
			errs = append(errs, setupError(v.Name, err))
			continue
		}
		dir := filepath.Join(m.Root, string(pod.UID), "volumes", plugin, v.Name)
		if m.Tmpfs && inMemory(v) {
			var size int64
			if v.EmptyDir != nil && v.EmptyDir.SizeLimit != nil {
				size = v.EmptyDir.SizeLimit.Value()
			}
			if err := mountTmpfs(dir, size); err != nil {
				errs = append(errs, setupError(v.Name, err))
				continue
			}
		}
		if v.EmptyDir != nil {
			if _, ok := pv.paths[v.Name]; !ok {
				// 0777 as the kubelet makes it: any user of the pod
				// writes; the fsGroup's once, before the pod has written.
				err := os.MkdirAll(dir, 0o777)
				if err == nil {
					err = os.Chmod(dir, 0o777)
				}
				if err == nil {
					err = setOwnership(dir, pod, false)
				}
				if err != nil {
					errs = append(errs, setupError(v.Name, err))
					continue
				}
			}
			paths[v.Name] = dir
			continue
		}
		files, due, err := m.files(ctx, pod, v, pv, now)
		if err == nil {
			var written bool
			if written, err = writeAtomic(dir, files); err == nil && written {
				err = setOwnership(dir, pod, true)
			}
		}
		if err != nil {
			errs = append(errs, setupError(v.Name, err))
			continue
		}
		if !due.IsZero() && due.Before(next) {
			// Not sooner than a retry, should the API server's clock
			// be far behind the node's.
			next = due
			if soonest := now.Add(retryAfter); next.Before(soonest) {
				next = soonest
			}
		}
		paths[v.Name] = dir
	}
	if len(errs) > 0 {
		return nil, time.Time{}, errors.Join(errs...)
	}
	return paths, next, nil
}

// pluginOf names the directory of v's type, as the kubelet does, or says
// that its type is not supported yet.
func pluginOf(v *corev1.Volume) (string, error) {
	switch {
	case v.Projected != nil:
		return "kubernetes.io~projected", nil
	case v.ConfigMap != nil:
		return "kubernetes.io~configmap", nil
	case v.Secret != nil:
		return "kubernetes.io~secret", nil
	case v.DownwardAPI != nil:
		return "kubernetes.io~downward-api", nil
	case v.EmptyDir != nil:
		return "kubernetes.io~empty-dir", nil
	}
	return "", fmt.Errorf("type %s not supported yet", volumeType(v))
}

// setupError is why the volume named name could not be set up, in the
// words of the kubelet's FailedMount event.
func setupError(name string, err error) error {
	return fmt.Errorf("MountVolume.SetUp failed for volume %q : %w", name, err)
}

// TearDown unmounts the pod's CSI volumes and removes its volumes; call
// it once its containers are gone. A pod's directory where something is
// still mounted is kept, and the error says what: removing it would
// remove the files of the volume mounted there.
func (m *Manager) TearDown(uid types.UID) error {
	m.mu.Lock()
	delete(m.pods, uid)
	m.mu.Unlock()
	dir := filepath.Join(m.Root, string(uid))
	if m.CSI != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		err := m.CSI.TearDown(ctx, uid)
		cancel()
		if err != nil {
			return fmt.Errorf("unmount the CSI volumes of pod %s: %w", uid, err)
		}
	}
	if err := unmountTmpfs(dir); err != nil {
		return fmt.Errorf("remove volumes of pod %s: %w", uid, err)
	}
	if err := os.RemoveAll(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove volumes of pod %s: %w", uid, err)
	}
	return nil
}

// Pods lists the UIDs of the pods that have volumes on the host, for
// removing those of pods deleted while the agent was not running.
func (m *Manager) Pods() ([]types.UID, error) {
	ents, err := os.ReadDir(m.Root)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list pods with volumes: %w", err)
	}
	var uids []types.UID
	for _, e := range ents {
		if e.IsDir() {
			uids = append(uids, types.UID(e.Name()))
		}
	}
	return uids, nil
}
