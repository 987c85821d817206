package main

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/cairn-os/cairn/machineconfig"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestProxyConfig(t *testing.T) {
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{corev1.LabelHostname: "n1-host"}},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
			{Type: corev1.NodeInternalIP, Address: "10.0.2.15"},
			{Type: corev1.NodeHostName, Address: "n1"},
			{Type: corev1.NodeInternalIP, Address: "fd00::15"},
		}},
	}
	cfg, err := proxyConfig(&machineconfig.Cluster{ClusterCIDRs: []string{"10.244.0.0/16", "fd00:244::/56"}}, node)
	if err != nil {
		t.Fatal(err)
	}
	wantIPs := []netip.Addr{netip.MustParseAddr("10.0.2.15"), netip.MustParseAddr("fd00::15")}
	wantCIDRs := []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:244::/56")}
	if cfg.NodeName != "n1" || cfg.Hostname != "n1-host" || !slices.Equal(cfg.NodeIPs, wantIPs) || !slices.Equal(cfg.ClusterCIDRs, wantCIDRs) {
		t.Errorf("proxyConfig() = %+v, want node n1, hostname n1-host, IPs %v, cluster CIDRs %v", cfg, wantIPs, wantCIDRs)
	}
}
