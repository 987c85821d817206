package server

import (
	"net"
	"slices"
	"testing"
)

func TestSans(t *testing.T) {
	dns, ips := sans([]string{"node-1", "10.0.0.2", "fd00::1", "node-1", "10.0.0.1", "10.0.0.2", "node-1.example"})
	if want := []string{"node-1", "node-1.example"}; !slices.Equal(dns, want) {
		t.Errorf("sans() DNS names = %v, want %v", dns, want)
	}
	want := []net.IP{net.ParseIP("10.0.0.1"), net.ParseIP("10.0.0.2"), net.ParseIP("fd00::1")}
	if !slices.EqualFunc(ips, want, net.IP.Equal) {
		t.Errorf("sans() IPs = %v, want %v", ips, want)
	}
}
