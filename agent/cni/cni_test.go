package cni

import (
	"flag"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden")

func TestConflist(t *testing.T) {
	for _, tt := range []struct {
		name string
		n    Network
	}{
		{"ipv4", Network{PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")}}},
		{"dualstack", Network{
			PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24"), netip.MustParsePrefix("fd00:10:244:1::/64")},
			Bridge:   "test0", DataDir: "/tmp/networks",
		}},
		{"mtu", Network{PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")}, MTU: 1450}},
	} {
		got, err := tt.n.Conflist()
		if err != nil {
			t.Fatalf("%s: Conflist() = %v", tt.name, err)
		}
		path := filepath.Join("testdata", tt.name+".golden")
		if *update {
			if err := os.WriteFile(path, got, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		want, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("%v (run go test -update to create it)", err)
		}
		if diff := cmp.Diff(string(want), string(got)); diff != "" {
			t.Errorf("%s: Conflist() differs from %s (-want +got; go test -update rewrites it):\n%s", tt.name, path, diff)
		}
	}
}

func TestConflistRefuses(t *testing.T) {
	for _, tt := range []struct {
		cidrs []netip.Prefix
		want  string
	}{
		{nil, "no pod CIDR"},
		{[]netip.Prefix{netip.MustParsePrefix("10.244.1.7/24")}, "not a network address"},
		{[]netip.Prefix{{}}, "not a network address"},
	} {
		if _, err := (Network{PodCIDRs: tt.cidrs}).Conflist(); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Conflist() with pod CIDRs %v = %v, want an error with %q", tt.cidrs, err, tt.want)
		}
	}
}
