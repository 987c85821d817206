package kubelet

import (
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

const webManifest = `apiVersion: v1
kind: Pod
metadata:
  name: web
  labels: {app: web}
  annotations: {team: infra}
spec:
  containers: [{name: web, image: registry.example/web:1.0}]
`

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
}

// onlyPod is the one pod read, or fails the test.
func onlyPod(t *testing.T, got []*corev1.Pod) *corev1.Pod {
	t.Helper()
	if len(got) != 1 {
		t.Fatalf("read() = %d pods, want 1", len(got))
	}
	return got[0]
}

// TestStaticSourceRead reads manifests as the kubelet's file source does:
// the pod named NAME-NODE on the node, its UID the hash of manifest and
// node, annotated; the same UID and seen time for the same manifest, a new
// UID for a changed one; a file that does not parse keeps its pod; hidden
// files, invalid pods and a second pod of the same name are left out.
func TestStaticSourceRead(t *testing.T) {
	dir := t.TempDir()
	src := newStaticSource(dir, "node-1", slog.New(slog.DiscardHandler))
	if got := newStaticSource(filepath.Join(dir, "none"), "node-1", slog.New(slog.DiscardHandler)).read(); len(got) != 0 {
		t.Errorf("read() of a missing directory = %d pods, want none", len(got))
	}
	writeFile(t, filepath.Join(dir, "web.yaml"), webManifest)
	writeFile(t, filepath.Join(dir, ".web.yaml-123"), "half a file")
	writeFile(t, filepath.Join(dir, "bad.yaml"), "apiVersion: v1\nkind: Pod\nmetadata: {name: bad}\nspec: {containers: [{name: c}]}\n")
	writeFile(t, filepath.Join(dir, "zz-web.yaml"), webManifest+"  hostNetwork: true\n")

	p := onlyPod(t, src.read())
	if p.Name != "web-node-1" || p.Namespace != "default" || p.Spec.NodeName != "node-1" || p.Labels["app"] != "web" {
		t.Errorf("static pod %s/%s on %q labels %v, want default/web-node-1 on node-1 with app=web", p.Namespace, p.Name, p.Spec.NodeName, p.Labels)
	}
	if p.Annotations[configSourceAnnotation] != fileSource || p.Annotations[configHashAnnotation] != string(p.UID) ||
		p.Annotations[configSeenAnnotation] == "" || p.Annotations["team"] != "infra" {
		t.Errorf("static pod annotations %v, want its own, config.source file, config.hash its UID %s, config.seen", p.Annotations, p.UID)
	}
	if p.Spec.HostNetwork {
		t.Errorf("read zz-web.yaml's pod web, want web.yaml's, the first in name order")
	}

	again := onlyPod(t, src.read())
	if again.UID != p.UID || again.Annotations[configSeenAnnotation] != p.Annotations[configSeenAnnotation] {
		t.Errorf("read() again = UID %s seen %s, want %s seen %s", again.UID, again.Annotations[configSeenAnnotation], p.UID, p.Annotations[configSeenAnnotation])
	}
	if other := newStaticSource(dir, "node-2", slog.New(slog.DiscardHandler)); onlyPod(t, other.read()).UID == p.UID {
		t.Errorf("the same manifest on node-2 has node-1's UID %s", p.UID)
	}

	writeFile(t, filepath.Join(dir, "web.yaml"), "apiVersion: v1\nkind: Po") // being written
	if got := onlyPod(t, src.read()); got.UID != p.UID {
		t.Errorf("read() of a half-written manifest = UID %s, want the pod kept, %s", got.UID, p.UID)
	}

	writeFile(t, filepath.Join(dir, "web.yaml"), webManifest+"  terminationGracePeriodSeconds: 5\n")
	changed := onlyPod(t, src.read())
	if changed.UID == p.UID {
		t.Errorf("read() of a changed manifest = UID %s, the old pod's", changed.UID)
	}
	if changed.Spec.TerminationGracePeriodSeconds == nil || *changed.Spec.TerminationGracePeriodSeconds != 5 {
		t.Errorf("changed pod's grace = %v, want 5", changed.Spec.TerminationGracePeriodSeconds)
	}
}
