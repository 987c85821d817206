package proxy

import (
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/cairn-os/cairn/test/kube"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// TestWithRealAPIServer feeds the proxier from a real kube-apiserver (the
// test/kube harness; skipped without its binaries): the API server
// allocates the ClusterIP, informers list and watch for real.
func TestWithRealAPIServer(t *testing.T) {
	needRoot(t)
	c := kube.Start(t, kube.Options{ServiceCIDR: "198.18.100.0/24"})
	e := newEnv(t, 2)
	e.kube = c.Client
	e.start()

	svc, err := c.Client.CoreV1().Services(testNS).Create(e.ctx(), &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: testNS, Name: "web"},
		Spec: v1.ServiceSpec{Ports: []v1.ServicePort{{
			Name: "http", Protocol: v1.ProtocolTCP, Port: 80, TargetPort: intstr.FromString("http"),
		}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create Service: %v", err)
	}
	addr := net.JoinHostPort(svc.Spec.ClusterIP, "80")
	// A Service without selector: its slices are ours to write.
	sl := endpointSlice("web", httpPort, ep(backendIP(0)), ep(backendIP(1)))
	sl.Labels["endpointslice.kubernetes.io/managed-by"] = "cairn.test"
	e.apply(sl)
	waitAnswers(t, e.client, addr)
	if seen := backendsOf(getN(t, e.client, addr, 30)); seen["be0"] == 0 || seen["be1"] == 0 {
		t.Errorf("30 connections to %s reached %v, want both backends", addr, seen)
	}

	sl.Endpoints = sl.Endpoints[1:]
	e.apply(sl)
	eventually(t, "only be1 left", func() error {
		if seen := backendsOf(getN(t, e.client, addr, 10)); seen["be0"] > 0 {
			return fmt.Errorf("be0 still reached: %v", seen)
		}
		return nil
	})

	e.deleteService("web")
	eventually(t, "Service's chains gone", func() error {
		for _, ch := range kernelChains(t, e.node) {
			if strings.Contains(ch, "/web/") {
				return fmt.Errorf("chain %s still there", ch)
			}
		}
		return nil
	})
	if _, err := httpGet(e.client, addr, 500*time.Millisecond); err == nil {
		t.Errorf("the deleted Service's ClusterIP %s still answers", addr)
	}
}
