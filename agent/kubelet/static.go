package kubelet

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/fsnotify/fsnotify"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/cairn-os/cairn/machineconfig/staticpod"
)

// Static pods: a second source of pods beside the API's, from the
// manifests in Config.StaticPodDir (written by init from
// machine.staticPods). Each runs as the kubelet runs its static pods: named
// NAME-NODE, bound to the node, its UID a hash of its manifest and the
// node's name — so a changed manifest is a new pod, which replaces the
// old one — and annotated with its source, hash and the time it was
// first seen. The directory is watched with inotify (fsnotify, the
// kubelet's own choice) so that a change applies at once, and read again
// every staticResync in case the watch missed one or could not be set
// (the directory is not there yet).

// The kubelet's annotations of static and mirror pods.
const (
	configSourceAnnotation = "kubernetes.io/config.source"
	configHashAnnotation   = "kubernetes.io/config.hash"
	configSeenAnnotation   = "kubernetes.io/config.seen"
	configMirrorAnnotation = "kubernetes.io/config.mirror"
	fileSource             = "file"
)

// isStatic tells a pod of the static source.
func isStatic(pod *corev1.Pod) bool {
	return pod.Annotations[configSourceAnnotation] == fileSource
}

// isMirror tells a static pod's mirror in the API, which the node does not
// run: its static pod is what runs.
func isMirror(pod *corev1.Pod) bool {
	_, ok := pod.Annotations[configMirrorAnnotation]
	return ok
}

// staticSource reads the static pods' manifests.
type staticSource struct {
	dir, nodeName string
	log           *slog.Logger
	// byFile is the pod last read from each file: a file that does not
	// parse (being written by someone who does not rename) keeps its
	// pod rather than stopping it.
	byFile map[string]*corev1.Pod
	// seen is when each pod was first read.
	seen map[types.UID]time.Time
}

func newStaticSource(dir, nodeName string, log *slog.Logger) *staticSource {
	return &staticSource{dir: dir, nodeName: nodeName, log: log.With("static pods", dir),
		byFile: map[string]*corev1.Pod{}, seen: map[types.UID]time.Time{}}
}

// read returns the static pods of the directory's manifests, logging the
// files it cannot use. A missing directory has none.
func (src *staticSource) read() []*corev1.Pod {
	ents, err := os.ReadDir(src.dir)
	if err != nil && !os.IsNotExist(err) {
		src.log.Error("cannot read the static pods' manifests; keeping the pods as they are", "err", err)
		return slices.Collect(maps.Values(src.byFile))
	}
	byFile := map[string]*corev1.Pod{}
	seen := map[types.UID]time.Time{}
	names := map[string]string{}
	for _, e := range ents {
		// Hidden files are the writers' temporary ones.
		if e.IsDir() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		file := filepath.Join(src.dir, e.Name())
		pod, err := src.readFile(file)
		if err != nil {
			if prev := src.byFile[e.Name()]; prev != nil {
				src.log.Warn("static pod manifest unusable; its pod keeps running as it was", "file", file, "err", err)
				pod = prev
			} else {
				src.log.Error("static pod manifest unusable", "file", file, "err", err)
				continue
			}
		} else {
			t := src.seen[pod.UID]
			if t.IsZero() {
				t = time.Now()
			}
			pod.Annotations[configSeenAnnotation] = t.Format(time.RFC3339Nano)
		}
		key := pod.Namespace + "/" + pod.Name
		if other, dup := names[key]; dup {
			src.log.Error("static pod manifest names a pod of another; ignored", "file", file, "pod", key, "other", other)
			continue
		}
		names[key] = file
		byFile[e.Name()] = pod
		if t, err := time.Parse(time.RFC3339Nano, pod.Annotations[configSeenAnnotation]); err == nil {
			seen[pod.UID] = t
		}
	}
	src.byFile, src.seen = byFile, seen
	return slices.Collect(maps.Values(byFile))
}

// readFile decodes and checks one manifest and makes its static pod.
func (src *staticSource) readFile(file string) (*corev1.Pod, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	manifest, err := staticpod.Decode(data)
	if err != nil {
		return nil, err
	}
	staticpod.SetDefaults(manifest)
	if err := staticpod.Validate(manifest, src.nodeName); err != nil {
		return nil, err
	}
	return newStaticPod(manifest, src.nodeName)
}

// newStaticPod is the pod the node runs for manifest: its metadata but
// the name, namespace, labels and annotations dropped, for the API to
// set on its mirror.
func newStaticPod(manifest *corev1.Pod, nodeName string) (*corev1.Pod, error) {
	data, err := json.Marshal(manifest)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(append(append(data, 0), nodeName...))
	hash := hex.EncodeToString(sum[:16])
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:        staticpod.Name(manifest, nodeName),
			Namespace:   manifest.Namespace,
			UID:         types.UID(hash),
			Labels:      manifest.Labels,
			Annotations: map[string]string{},
		},
		Spec:   *manifest.Spec.DeepCopy(),
		Status: corev1.PodStatus{Phase: corev1.PodPending},
	}
	for k, v := range manifest.Annotations {
		pod.Annotations[k] = v
	}
	pod.Annotations[configSourceAnnotation] = fileSource
	pod.Annotations[configHashAnnotation] = hash
	pod.Spec.NodeName = nodeName
	return pod, nil
}

// watchStatic keeps the static pods those of src's directory until ctx
// ends.
func (s *podSyncer) watchStatic(ctx context.Context, src *staticSource, resync time.Duration) {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		src.log.Error("cannot watch the static pods' manifests; reading them every "+resync.String(), "err", err)
	} else {
		defer w.Close()
	}
	watching := false
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		var events <-chan fsnotify.Event
		var errs <-chan error
		if w != nil {
			if !watching {
				// Not there yet, or removed: tried again each resync.
				watching = w.Add(src.dir) == nil
			}
			events, errs = w.Events, w.Errors
		}
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
			timer.Reset(resync)
		case e := <-events:
			if e.Name == src.dir && e.Has(fsnotify.Remove|fsnotify.Rename) {
				watching = false
			}
		case err := <-errs:
			src.log.Warn("watch of the static pods' manifests", "err", err)
		}
		s.setStatic(src.read())
	}
}

// setStatic makes pods the static pods: those new start, those no longer
// there stop with their grace period.
func (s *podSyncer) setStatic(pods []*corev1.Pod) {
	s.mu.Lock()
	defer s.mu.Unlock()
	next := map[types.UID]*corev1.Pod{}
	for _, p := range pods {
		next[p.UID] = p
		if s.static[p.UID] == nil {
			s.k.log.Info("static pod added", "pod", p.Namespace+"/"+p.Name, "uid", p.UID)
			s.see(s.ctx, p, false)
		}
	}
	for uid, p := range s.static {
		if next[uid] == nil {
			s.k.log.Info("static pod removed", "pod", p.Namespace+"/"+p.Name, "uid", p.UID)
			s.see(s.ctx, p, true)
		}
	}
	s.static = next
	s.pokeMirrors()
}

// staticPods are the static pods with their latest status.
func (s *podSyncer) staticPods() []*corev1.Pod {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*corev1.Pod
	for uid, p := range s.static {
		if w := s.workers[uid]; w != nil {
			w.mu.Lock()
			p = w.pod
			w.mu.Unlock()
		}
		out = append(out, p)
	}
	return out
}
