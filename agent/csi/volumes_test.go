package csi

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/utils/ptr"
)

// TestFSGroupApplies checks the kubelet's rule for a pod's fsGroup on a
// CSI volume, by the driver's fsGroupPolicy and the volume.
func TestFSGroupApplies(t *testing.T) {
	grouped := &corev1.Pod{Spec: corev1.PodSpec{SecurityContext: &corev1.PodSecurityContext{FSGroup: ptr.To[int64](2000)}}}
	driver := func(p storagev1.FSGroupPolicy) *storagev1.CSIDriver {
		return &storagev1.CSIDriver{Spec: storagev1.CSIDriverSpec{FSGroupPolicy: &p}}
	}
	rwo := &source{fsType: "ext4", readWriteOnce: true}
	for _, tc := range []struct {
		name string
		info *storagev1.CSIDriver
		src  *source
		pod  *corev1.Pod
		want bool
	}{
		{"no fsGroup", driver(storagev1.FileFSGroupPolicy), rwo, &corev1.Pod{}, false},
		{"File", driver(storagev1.FileFSGroupPolicy), &source{}, grouped, true},
		{"None", driver(storagev1.NoneFSGroupPolicy), rwo, grouped, false},
		{"default, ext4 ReadWriteOnce", nil, rwo, grouped, true},
		{"default, no fsType", nil, &source{readWriteOnce: true}, grouped, false},
		{"default, ReadWriteMany", nil, &source{fsType: "ext4"}, grouped, false},
		{"default, inline with fsType", nil, &source{fsType: "ext4", ephemeral: true}, grouped, true},
		{"read-only", driver(storagev1.FileFSGroupPolicy), &source{readOnly: true}, grouped, false},
		{"block", driver(storagev1.FileFSGroupPolicy), &source{block: true}, grouped, false},
	} {
		if got := fsGroupApplies(tc.info, tc.src, tc.pod); got != tc.want {
			t.Errorf("%s: fsGroupApplies = %t, want %t", tc.name, got, tc.want)
		}
	}
}
