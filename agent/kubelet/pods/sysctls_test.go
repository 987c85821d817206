package pods

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
)

func TestAdmitSysctls(t *testing.T) {
	pod := func(hostNet, hostIPC bool, names ...string) *corev1.Pod {
		p := &corev1.Pod{Spec: corev1.PodSpec{HostNetwork: hostNet, HostIPC: hostIPC, SecurityContext: &corev1.PodSecurityContext{}}}
		for _, n := range names {
			p.Spec.SecurityContext.Sysctls = append(p.Spec.SecurityContext.Sysctls, corev1.Sysctl{Name: n, Value: "1"})
		}
		return p
	}
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
		want []string
	}{
		{"no security context", &corev1.Pod{}, nil},
		{"safe ones, dots and slashes", pod(false, false, "kernel.shm_rmid_forced", "net/ipv4/ip_local_port_range"), nil},
		{"unsafe one, though namespaced", pod(false, false, "kernel.msgmax"), []string{`"kernel.msgmax" not allowlisted`}},
		{"unsafe one with slashes, by its dotted name", pod(false, false, "kernel/shmmax"), []string{`"kernel.shmmax" not allowlisted`}},
		{"net sysctl on the host network", pod(true, false, "net.ipv4.tcp_syncookies"), []string{`"net.ipv4.tcp_syncookies" not allowed with host Net enabled`}},
		{"IPC sysctl in the host's IPC namespace", pod(false, true, "kernel.shm_rmid_forced"), []string{`"kernel.shm_rmid_forced" not allowed with host IPC enabled`}},
		{"IPC sysctl on the host network is fine", pod(true, false, "kernel.shm_rmid_forced"), nil},
		{"each forbidden one told", pod(false, false, "kernel.msgmax", "kernel.shm_rmid_forced", "vm.swappiness"),
			[]string{`"kernel.msgmax" not allowlisted`, `"vm.swappiness" not allowlisted`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, forbiddenSysctls(tc.pod)); diff != "" {
				t.Errorf("forbiddenSysctls (-want +got):\n%s", diff)
			}
			reason, msg := AdmitSysctls(tc.pod)
			if tc.want == nil && (reason != "" || msg != "") || tc.want != nil && (reason != "SysctlForbidden" || msg != "forbidden sysctl: "+tc.want[0]) {
				t.Errorf("AdmitSysctls = %q, %q; want the first forbidden one refused with SysctlForbidden", reason, msg)
			}
		})
	}
}

// TestSandboxSysctls checks that the sandbox asks the runtime for the
// pod's sysctls by their dotted names, a dot inside a slashed name's part
// (an interface such as eth0.100) becoming a slash.
func TestSandboxSysctls(t *testing.T) {
	w := &Worker{cfg: Config{LogRoot: t.TempDir()}}
	pod := &corev1.Pod{Spec: corev1.PodSpec{SecurityContext: &corev1.PodSecurityContext{Sysctls: []corev1.Sysctl{
		{Name: "kernel.shm_rmid_forced", Value: "1"},
		{Name: "net/ipv4/conf/eth0.100/forwarding", Value: "0"},
	}}}}
	want := map[string]string{"kernel.shm_rmid_forced": "1", "net.ipv4.conf.eth0/100.forwarding": "0"}
	if diff := cmp.Diff(want, w.sandboxConfig(pod, 0).Linux.Sysctls); diff != "" {
		t.Errorf("sandbox sysctls (-want +got):\n%s", diff)
	}
	if got := w.sandboxConfig(&corev1.Pod{}, 0).Linux.Sysctls; got != nil {
		t.Errorf("sandbox sysctls of a pod without any: %v, want none", got)
	}
}
