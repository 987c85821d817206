package kubelet

import (
	"runtime"

	corev1 "k8s.io/api/core/v1"

	"github.com/cairn-os/cairn/agent/kubelet/pods"
)

// Pod admission: before the node starts a pod it first sees, it checks
// that it can run it at all, as the kubelet's admission does, and a pod
// it refuses ends Failed with the check's reason and message (the
// kubelet's, after "Pod was rejected: ") and a Warning event, without
// anything started. The scheduler's checks (node name, selector,
// affinity, resources) are not made again: a pod bound to the node by
// spec.nodeName is taken to be meant for it.

// admitCheck refuses pod on node with a reason and a message, or admits
// it with "", "".
type admitCheck func(pod *corev1.Pod, node *corev1.Node) (reason, message string)

// admitChecks are the node's, in the order they are made: the first
// refusal is the pod's.
var admitChecks = []admitCheck{
	admitOSLabel,
	admitOS,
	admitSupplementalGroupsPolicy,
	admitSysctls,
}

// admit returns why pod cannot run on node; "" if it can.
func admit(pod *corev1.Pod, node *corev1.Node) (reason, message string) {
	for _, check := range admitChecks {
		if reason, message = check(pod, node); reason != "" {
			return reason, "Pod was rejected: " + message
		}
	}
	return "", ""
}

// admitOSLabel refuses a pod labelled (kubernetes.io/os) for another OS
// than the node's, which is the agent's own whatever the Node's label
// says yet.
func admitOSLabel(pod *corev1.Pod, _ *corev1.Node) (reason, message string) {
	if os, ok := pod.Labels[corev1.LabelOSStable]; ok && os != runtime.GOOS {
		return "PodOSSelectorNodeLabelDoesNotMatch", "Failed to admit pod as the `kubernetes.io/os` label doesn't match node label"
	}
	return "", ""
}

// admitOS refuses a pod whose spec.os is not the node's.
func admitOS(pod *corev1.Pod, _ *corev1.Node) (reason, message string) {
	if pod.Spec.OS != nil && string(pod.Spec.OS.Name) != runtime.GOOS {
		return "PodOSNotSupported", "Failed to admit pod as the OS field doesn't match node OS"
	}
	return "", ""
}

// admitSupplementalGroupsPolicy refuses a pod that asks for the Strict
// supplemental groups policy from a node that does not say it supports
// it (status.features): the groups of its images' users would otherwise
// be added silently.
func admitSupplementalGroupsPolicy(pod *corev1.Pod, node *corev1.Node) (reason, message string) {
	sc := pod.Spec.SecurityContext
	if sc == nil || sc.SupplementalGroupsPolicy == nil || *sc.SupplementalGroupsPolicy != corev1.SupplementalGroupsPolicyStrict {
		return "", ""
	}
	if f := node.Status.Features; f != nil && f.SupplementalGroupsPolicy != nil && *f.SupplementalGroupsPolicy {
		return "", ""
	}
	return "SupplementalGroupsPolicyNotSupported", "SupplementalGroupsPolicy=Strict is not supported in this node"
}

// admitSysctls refuses a pod that asks for a sysctl the node does not
// allow (agent/kubelet/pods says which it allows).
func admitSysctls(pod *corev1.Pod, _ *corev1.Node) (reason, message string) {
	return pods.AdmitSysctls(pod)
}
