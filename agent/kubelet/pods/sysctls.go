package pods

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	utilsysctl "k8s.io/component-helpers/node/util/sysctl"
)

// ReasonSysctlForbidden is the kubelet's reason for refusing a pod that
// asks for a sysctl the node does not allow (AdmitSysctls).
const ReasonSysctlForbidden = "SysctlForbidden"

// safeSysctls are the kubelet's safe sysctls, the only ones a node allows
// without an admin's say: each is namespaced, in the pod's network or IPC
// namespace, and touches no other pod. (The kubelet drops some on kernels
// before 4.15, which they are not namespaced in; Cairn runs none that
// old.)
var safeSysctls = map[string]bool{
	"kernel.shm_rmid_forced":              true,
	"net.ipv4.ip_local_port_range":        true,
	"net.ipv4.tcp_syncookies":             true,
	"net.ipv4.ping_group_range":           true,
	"net.ipv4.ip_unprivileged_port_start": true,
	"net.ipv4.ip_local_reserved_ports":    true,
	"net.ipv4.tcp_keepalive_time":         true,
	"net.ipv4.tcp_fin_timeout":            true,
	"net.ipv4.tcp_keepalive_intvl":        true,
	"net.ipv4.tcp_keepalive_probes":       true,
	"net.ipv4.tcp_rmem":                   true,
	"net.ipv4.tcp_wmem":                   true,
	"net.ipv4.tcp_slow_start_after_idle":  true,
	"net.ipv4.tcp_notsent_lowat":          true,
}

// AdmitSysctls refuses, with the kubelet's reason and message, a pod
// whose securityContext asks for a sysctl the node does not allow (see
// forbiddenSysctls), for pod admission; "", "" if it allows them all.
func AdmitSysctls(pod *corev1.Pod) (reason, message string) {
	if f := forbiddenSysctls(pod); len(f) > 0 {
		return ReasonSysctlForbidden, "forbidden sysctl: " + f[0]
	}
	return "", ""
}

// forbiddenSysctls says, one sentence each, why the sysctls of the pod's
// securityContext that the node does not allow are forbidden: one not
// among the safe sysctls (the node allows no other), or one of a
// namespace the pod shares with the host (a net.* sysctl with
// hostNetwork, an IPC one with hostIPC). Names may use / as the separator
// (kernel/shm_rmid_forced).
func forbiddenSysctls(pod *corev1.Pod) []string {
	sc := pod.Spec.SecurityContext
	if sc == nil {
		return nil
	}
	var out []string
	for _, s := range sc.Sysctls {
		name := utilsysctl.NormalizeName(s.Name)
		ns, _, _ := utilsysctl.GetNamespace(name)
		switch {
		case !safeSysctls[name]:
			out = append(out, fmt.Sprintf("%q not allowlisted", name))
		case ns == utilsysctl.NetNamespace && pod.Spec.HostNetwork, ns == utilsysctl.IPCNamespace && pod.Spec.HostIPC:
			out = append(out, fmt.Sprintf("%q not allowed with host %s enabled", name, ns))
		}
	}
	return out
}

// sysctls are the sysctls of the pod's securityContext by their names
// with dots, as the runtime sets them in the sandbox's namespaces (runc
// checks a name is namespaced by its dotted form).
func sysctls(pod *corev1.Pod) map[string]string {
	sc := pod.Spec.SecurityContext
	if sc == nil || len(sc.Sysctls) == 0 {
		return nil
	}
	out := make(map[string]string, len(sc.Sysctls))
	for _, s := range sc.Sysctls {
		out[utilsysctl.NormalizeName(s.Name)] = s.Value
	}
	return out
}
