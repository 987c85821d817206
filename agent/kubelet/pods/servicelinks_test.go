package pods

import (
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func service(ns, name, ip string, ports ...corev1.ServicePort) *corev1.Service {
	return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: corev1.ServiceSpec{ClusterIP: ip, Ports: ports}}
}

func TestServiceEnv(t *testing.T) {
	refs := testRefs()
	refs.services = map[string][]*corev1.Service{
		"default": {
			service("default", "kubernetes", "10.96.0.1", corev1.ServicePort{Name: "https", Port: 443, Protocol: corev1.ProtocolTCP}),
			service("default", "other", "10.96.0.9", corev1.ServicePort{Port: 1, Protocol: corev1.ProtocolTCP}),
		},
		"shop": {
			service("shop", "my-svc", "10.96.0.12",
				corev1.ServicePort{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP},
				corev1.ServicePort{Name: "dns-udp", Port: 53, Protocol: corev1.ProtocolUDP}),
			service("shop", "headless", corev1.ClusterIPNone, corev1.ServicePort{Port: 80, Protocol: corev1.ProtocolTCP}),
		},
	}
	master := []string{
		"KUBERNETES_SERVICE_HOST=10.96.0.1", "KUBERNETES_SERVICE_PORT=443", "KUBERNETES_SERVICE_PORT_HTTPS=443",
		"KUBERNETES_PORT=tcp://10.96.0.1:443", "KUBERNETES_PORT_443_TCP=tcp://10.96.0.1:443",
		"KUBERNETES_PORT_443_TCP_PROTO=tcp", "KUBERNETES_PORT_443_TCP_PORT=443", "KUBERNETES_PORT_443_TCP_ADDR=10.96.0.1",
	}
	mySvc := []string{
		"MY_SVC_SERVICE_HOST=10.96.0.12", "MY_SVC_SERVICE_PORT=80", "MY_SVC_SERVICE_PORT_HTTP=80", "MY_SVC_SERVICE_PORT_DNS_UDP=53",
		"MY_SVC_PORT=tcp://10.96.0.12:80",
		"MY_SVC_PORT_80_TCP=tcp://10.96.0.12:80", "MY_SVC_PORT_80_TCP_PROTO=tcp", "MY_SVC_PORT_80_TCP_PORT=80", "MY_SVC_PORT_80_TCP_ADDR=10.96.0.12",
		"MY_SVC_PORT_53_UDP=udp://10.96.0.12:53", "MY_SVC_PORT_53_UDP_PROTO=udp", "MY_SVC_PORT_53_UDP_PORT=53", "MY_SVC_PORT_53_UDP_ADDR=10.96.0.12",
	}

	t.Run("links on", func(t *testing.T) {
		c := corev1.Container{Name: "app", Env: []corev1.EnvVar{
			{Name: "MY_SVC_SERVICE_HOST", Value: "overridden"},
			{Name: "API", Value: "https://$(KUBERNETES_SERVICE_HOST):$(KUBERNETES_SERVICE_PORT)"},
		}}
		got, err := envOf(t, refs, testPod(c), &c)
		if err != nil {
			t.Fatal(err)
		}
		want := slices.Concat(mySvc, master, []string{"API=https://10.96.0.1:443"})
		want[0] = "MY_SVC_SERVICE_HOST=overridden"
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("env (-want +got):\n%s", diff)
		}
	})
	t.Run("links off", func(t *testing.T) {
		c := corev1.Container{Name: "app"}
		pod := testPod(c)
		pod.Spec.EnableServiceLinks = new(bool)
		got, err := envOf(t, refs, pod, &c)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(master, got); diff != "" {
			t.Errorf("env (-want +got):\n%s", diff)
		}
	})
	t.Run("default namespace", func(t *testing.T) {
		c := corev1.Container{Name: "app"}
		pod := testPod(c)
		pod.Namespace = "default"
		got, err := envOf(t, refs, pod, &c)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(got, "OTHER_SERVICE_HOST=10.96.0.9") || slices.Index(got, "KUBERNETES_SERVICE_HOST=10.96.0.1") < 0 {
			t.Errorf("env = %q, want both default Services' variables, kubernetes once", got)
		}
		if n := len(got); n != len(master)+7 {
			t.Errorf("%d variables, want %d: %q", n, len(master)+7, got)
		}
	})
}
