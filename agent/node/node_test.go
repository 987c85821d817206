package node

import (
	"regexp"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	"github.com/cairn-os/cairn/agent/node/host"
)

func TestCapacityAllocatable(t *testing.T) {
	mem := &host.Memory{Total: 4 << 30}
	disk := &host.Filesystem{Size: 20 << 30}
	tests := []struct {
		name                   string
		cpus                   int
		mem                    *host.Memory
		disk                   *host.Filesystem
		wantCapacity, wantAllo map[corev1.ResourceName]string
	}{
		{
			name: "all measured", cpus: 2, mem: mem, disk: disk,
			wantCapacity: map[corev1.ResourceName]string{"cpu": "2", "memory": "4Gi", "pods": "110", "ephemeral-storage": "20Gi"},
			wantAllo:     map[corev1.ResourceName]string{"cpu": "1900m", "memory": "3740Mi", "pods": "110", "ephemeral-storage": "18Gi"},
		},
		{
			name: "memory and disk unknown", cpus: 1,
			wantCapacity: map[corev1.ResourceName]string{"cpu": "1", "pods": "110"},
			wantAllo:     map[corev1.ResourceName]string{"cpu": "900m", "pods": "110"},
		},
		{
			name: "less memory than the reservation", cpus: 1, mem: &host.Memory{Total: 300 << 20},
			wantCapacity: map[corev1.ResourceName]string{"cpu": "1", "memory": "300Mi", "pods": "110"},
			wantAllo:     map[corev1.ResourceName]string{"cpu": "900m", "memory": "0", "pods": "110"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := capacity(tt.cpus, tt.mem, tt.disk)
			if diff := cmp.Diff(tt.wantCapacity, quantities(c)); diff != "" {
				t.Errorf("capacity() mismatch (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.wantAllo, quantities(allocatable(c, DefaultThresholds))); diff != "" {
				t.Errorf("allocatable() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func quantities(l corev1.ResourceList) map[corev1.ResourceName]string {
	m := map[corev1.ResourceName]string{}
	for name, q := range l {
		m[name] = q.String()
	}
	return m
}

func TestKubeletVersion(t *testing.T) {
	if got, want := kubeletVersion("0.1.0"), "v1.37.2+cairn.0.1.0"; got != want {
		t.Errorf("kubeletVersion(0.1.0) = %q, want %q", got, want)
	}
}

func TestDerivedMachineID(t *testing.T) {
	a, b := derivedMachineID("node-1"), derivedMachineID("node-2")
	if !regexp.MustCompile(`^[0-9a-f]{32}$`).MatchString(a) {
		t.Errorf("derivedMachineID(node-1) = %q, want 32 hex digits", a)
	}
	if a == b || a != derivedMachineID("node-1") {
		t.Errorf("derivedMachineID gives %q for node-1 (twice: %q) and %q for node-2; want stable and distinct", a, derivedMachineID("node-1"), b)
	}
}
