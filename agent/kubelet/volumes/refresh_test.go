package volumes

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestRefreshDue moves the manager's clock: Refresh writes a pod's
// volumes again only once Resync has passed, and after a failure only
// once retryAfter has. A downwardAPI volume needs no API server.
func TestRefreshDue(t *testing.T) {
	clk := &clock{}
	m := &Manager{Root: t.TempDir(), Now: clk.now}
	ctx := context.Background()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", UID: "uid-1", Labels: map[string]string{"v": "1"}},
		Spec: corev1.PodSpec{Volumes: []corev1.Volume{{Name: "meta", VolumeSource: corev1.VolumeSource{
			DownwardAPI: &corev1.DownwardAPIVolumeSource{Items: []corev1.DownwardAPIVolumeFile{
				{Path: "labels", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.labels"}},
			}},
		}}}},
	}
	paths, err := m.Setup(ctx, pod)
	if err != nil {
		t.Fatalf("Setup = %v", err)
	}
	labels := func() string {
		t.Helper()
		data, err := os.ReadFile(filepath.Join(paths["meta"], "labels"))
		if err != nil {
			t.Fatal(err)
		}
		return string(data)
	}
	refresh := func(after time.Duration) error {
		clk.advance(after)
		return m.Refresh(ctx, pod)
	}

	pod.Labels["v"] = "2"
	if err := refresh(DefaultResync - time.Second); err != nil || labels() != `v="1"` {
		t.Errorf("within Resync: Refresh = %v, labels %s; want no error and the old labels", err, labels())
	}
	if err := refresh(time.Second); err != nil || labels() != `v="2"` {
		t.Errorf("after Resync: Refresh = %v, labels %s; want no error and the new labels", err, labels())
	}

	// A volume that cannot be made fails the refresh, which is then
	// tried again only after retryAfter; what was written stays.
	pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: "nfs", VolumeSource: corev1.VolumeSource{NFS: &corev1.NFSVolumeSource{}}})
	if err := refresh(DefaultResync); err == nil || !strings.Contains(err.Error(), `volume "nfs" : type nfs not supported yet`) {
		t.Errorf("Refresh with an nfs volume = %v, want it not supported", err)
	}
	if err := refresh(retryAfter - time.Second); err != nil {
		t.Errorf("Refresh within retryAfter of a failure = %v, want nothing done", err)
	}
	if err := refresh(time.Second); err == nil {
		t.Error("Refresh after retryAfter = nil error, want it tried again")
	}
	if got, err := m.Setup(ctx, pod); err != nil || got["meta"] != paths["meta"] {
		t.Errorf("Setup after a failed refresh = %v, %v; want the volumes written before", got, err)
	}
}
