package proxy

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/cairn-os/cairn/test/kube"
)

// TestMain runs the tests under kube.Main: the traffic tests share one real
// control plane (test/kube; without its binaries they skip, or fail with
// CAIRN_NO_SKIP set), started by the first of them and stopped
// after the last, whatever the outcome. The unit tests start nothing.
func TestMain(m *testing.M) {
	os.Exit(kube.Main(m, kube.Options{ServiceCIDR: testServiceCIDR}))
}

// TestClusterIPAllocatedByTheAPIServer leaves the ClusterIP to the API
// server, as most users do: the proxier serves whichever address of the
// Service range it got.
func TestClusterIPAllocatedByTheAPIServer(t *testing.T) {
	e := newEnv(t, 2)
	e.start()

	svc, err := e.kube.CoreV1().Services(e.ns).Create(e.ctx(), &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: v1.ServiceSpec{Ports: []v1.ServicePort{{
			Name: "http", Protocol: v1.ProtocolTCP, Port: 80, TargetPort: intstr.FromString("http"),
		}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create Service: %v", err)
	}
	ip, err := netip.ParseAddr(svc.Spec.ClusterIP)
	if err != nil || !netip.MustParsePrefix("198.18.100.0/24").Contains(ip) {
		t.Fatalf("allocated ClusterIP %q, want one of the primary Service range 198.18.100.0/24", svc.Spec.ClusterIP)
	}
	addr := net.JoinHostPort(svc.Spec.ClusterIP, "80")
	sl := endpointSlice("web", httpPort, ep(backendIP(0)), ep(backendIP(1)))
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

// TestOtherProxysServices wants the Services that another proxy serves
// (label service.kubernetes.io/service-proxy-name) left alone, from the
// informers the agent shares, which hold every Service: such a Service is
// served once the label goes, and left again when it comes back.
func TestOtherProxysServices(t *testing.T) {
	e := newEnv(t, 1)
	e.start()
	const otherIP, markerIP = "198.18.100.201", "198.18.100.202"
	other := service("other", otherIP, svcPort("http", v1.ProtocolTCP, 80, "http"))
	other.Labels = map[string]string{labelServiceProxyName: "someone-else"}
	e.apply(other, endpointSlice("other", httpPort, ep(backendIP(0))))
	// A Service of ours made afterwards: once it answers, the proxier
	// synced with the other one in its informers.
	e.apply(service("marker", markerIP, svcPort("http", v1.ProtocolTCP, 80, "http")),
		endpointSlice("marker", httpPort, ep(backendIP(0))))
	waitAnswers(t, e.client, net.JoinHostPort(markerIP, "80"))
	otherChains := func() []string {
		var chs []string
		for _, ch := range kernelChains(t, e.node) {
			if strings.Contains(ch, "/other/") {
				chs = append(chs, ch)
			}
		}
		return chs
	}
	if chs := otherChains(); len(chs) > 0 {
		t.Errorf("chains %v for a Service of another proxy, want none", chs)
	}

	other.Labels = nil
	e.apply(other)
	waitAnswers(t, e.client, net.JoinHostPort(otherIP, "80"))

	other.Labels = map[string]string{labelServiceProxyName: "someone-else"}
	e.apply(other)
	eventually(t, "chains of the Service gone to another proxy", func() error {
		if chs := otherChains(); len(chs) > 0 {
			return fmt.Errorf("chains %v still there", chs)
		}
		return nil
	})
}
