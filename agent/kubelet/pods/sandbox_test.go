package pods

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestPodHostname(t *testing.T) {
	override := func(s string) *string { return &s }
	yes := true
	long := strings.Repeat("a", 62) + "-b"
	for _, tc := range []struct {
		name                 string
		spec                 corev1.PodSpec
		host, domain, kernel string
	}{
		{"the pod's name", corev1.PodSpec{}, "web-0", "", "web-0"},
		{"hostname", corev1.PodSpec{Hostname: "web"}, "web", "", "web"},
		{"hostname and subdomain", corev1.PodSpec{Hostname: "web", Subdomain: "sub"}, "web", "sub.ns.svc.cluster.local", "web"},
		{"setHostnameAsFQDN", corev1.PodSpec{Subdomain: "sub", SetHostnameAsFQDN: &yes}, "web-0", "sub.ns.svc.cluster.local", "web-0.sub.ns.svc.cluster.local"},
		{"hostnameOverride, a subdomain with dots", corev1.PodSpec{HostnameOverride: override("override.example.host")},
			"override.example.host", "", "override.example.host"},
		{"hostnameOverride over hostname and subdomain", corev1.PodSpec{Hostname: "web", Subdomain: "sub", HostnameOverride: override("over")},
			"over", "", "over"},
		{"cut to 63, without a trailing dash", corev1.PodSpec{Hostname: long}, strings.Repeat("a", 62), "", strings.Repeat("a", 62)},
		{"host network: the node's own in the kernel", corev1.PodSpec{HostNetwork: true}, "web-0", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := &Worker{cfg: Config{ClusterDNS: &ClusterDNS{Servers: []string{"10.96.0.10"}, Domain: "cluster.local"}}}
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web-0", Namespace: "ns"}, Spec: tc.spec}
			if host, domain := w.podHostname(pod); host != tc.host || domain != tc.domain {
				t.Errorf("podHostname = %q, %q; want %q, %q", host, domain, tc.host, tc.domain)
			}
			if got := w.kernelHostname(pod); got != tc.kernel {
				t.Errorf("kernelHostname = %q, want %q", got, tc.kernel)
			}
		})
	}
	w := &Worker{}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web-0", Namespace: "ns"}, Spec: corev1.PodSpec{Subdomain: "sub"}}
	if _, domain := w.podHostname(pod); domain != "" {
		t.Errorf("domain without a cluster domain: %q, want none", domain)
	}
}
