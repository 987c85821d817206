package kubelet

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestAdmit runs the node's admission on pods it runs and pods it
// refuses, with the kubelet's reasons and messages.
func TestAdmit(t *testing.T) {
	strict, merge := corev1.SupplementalGroupsPolicyStrict, corev1.SupplementalGroupsPolicyMerge
	yes := true
	for _, tc := range []struct {
		name            string
		pod             corev1.Pod
		node            corev1.Node
		reason, message string
	}{
		{name: "plain pod"},
		{name: "linux pod", pod: corev1.Pod{Spec: corev1.PodSpec{OS: &corev1.PodOS{Name: corev1.Linux}}}},
		{name: "windows pod", pod: corev1.Pod{Spec: corev1.PodSpec{OS: &corev1.PodOS{Name: corev1.Windows}}},
			reason: "PodOSNotSupported", message: "Pod was rejected: Failed to admit pod as the OS field doesn't match node OS"},
		{name: "labelled for windows",
			pod:    corev1.Pod{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{corev1.LabelOSStable: "windows"}}},
			node:   corev1.Node{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{corev1.LabelOSStable: "linux"}}},
			reason: "PodOSSelectorNodeLabelDoesNotMatch", message: "Pod was rejected: Failed to admit pod as the `kubernetes.io/os` label doesn't match node label"},
		{name: "labelled for linux, node not labelled yet",
			pod: corev1.Pod{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{corev1.LabelOSStable: "linux"}}}},
		{name: "Merge supplemental groups",
			pod: corev1.Pod{Spec: corev1.PodSpec{SecurityContext: &corev1.PodSecurityContext{SupplementalGroupsPolicy: &merge}}}},
		{name: "Strict supplemental groups, node silent",
			pod:    corev1.Pod{Spec: corev1.PodSpec{SecurityContext: &corev1.PodSecurityContext{SupplementalGroupsPolicy: &strict}}},
			reason: "SupplementalGroupsPolicyNotSupported", message: "Pod was rejected: SupplementalGroupsPolicy=Strict is not supported in this node"},
		{name: "Strict supplemental groups, node supports it",
			pod:  corev1.Pod{Spec: corev1.PodSpec{SecurityContext: &corev1.PodSecurityContext{SupplementalGroupsPolicy: &strict}}},
			node: corev1.Node{Status: corev1.NodeStatus{Features: &corev1.NodeFeatures{SupplementalGroupsPolicy: &yes}}}},
		{name: "safe sysctl",
			pod: corev1.Pod{Spec: corev1.PodSpec{SecurityContext: &corev1.PodSecurityContext{Sysctls: []corev1.Sysctl{{Name: "kernel.shm_rmid_forced", Value: "1"}}}}}},
		{name: "unsafe sysctl",
			pod:    corev1.Pod{Spec: corev1.PodSpec{SecurityContext: &corev1.PodSecurityContext{Sysctls: []corev1.Sysctl{{Name: "kernel.msgmax", Value: "10000000000"}}}}},
			reason: "SysctlForbidden", message: `Pod was rejected: forbidden sysctl: "kernel.msgmax" not allowlisted`},
	} {
		reason, message := admit(&tc.pod, &tc.node)
		if reason != tc.reason || message != tc.message {
			t.Errorf("%s: admit = %q, %q; want %q, %q", tc.name, reason, message, tc.reason, tc.message)
		}
	}
}
