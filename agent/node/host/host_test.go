package host

import (
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseMeminfo(t *testing.T) {
	tests := []struct {
		name, in string
		want     Memory
		wantErr  string
	}{
		{
			name: "both",
			in:   "MemTotal:       16384000 kB\nMemFree:          100 kB\nMemAvailable:    8192000 kB\nBuffers: 1 kB\n",
			want: Memory{Total: 16384000 * 1024, Available: 8192000 * 1024},
		},
		{name: "no MemAvailable", in: "MemTotal: 1 kB\n", wantErr: "meminfo: no MemTotal or MemAvailable"},
		{name: "not kB", in: "MemTotal: 1 MB\nMemAvailable: 1 kB\n", wantErr: `meminfo: MemTotal: "1 MB" is not a size in kB`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseMeminfo([]byte(tt.in))
			if errString(err) != tt.wantErr || got != tt.want {
				t.Errorf("parseMeminfo() = %+v, %v; want %+v, %q", got, err, tt.want, tt.wantErr)
			}
		})
	}
}

func TestParseTasks(t *testing.T) {
	if got, err := parseTasks([]byte("2.29 2.76 2.96 1/107 2387\n")); got != 107 || err != nil {
		t.Errorf("parseTasks() = %d, %v; want 107, nil", got, err)
	}
	if _, err := parseTasks([]byte("2.29 2.76 2.96 107 2387\n")); err == nil {
		t.Errorf("parseTasks() of a count without a slash: no error")
	}
}

func TestParseOSRelease(t *testing.T) {
	tests := []struct{ in, want string }{
		{"NAME=Debian\nPRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\n", "Debian GNU/Linux 12 (bookworm)"},
		{"PRETTY_NAME='Cairn 0.1 \\$x'\n", "Cairn 0.1 \\$x"},
		{"PRETTY_NAME=\"Say \\\"hi\\\" \\$5\"\n", "Say \"hi\" $5"},
		{"PRETTY_NAME=Cairn\n", "Cairn"},
	}
	for _, tt := range tests {
		if got, err := parseOSRelease([]byte(tt.in)); got != tt.want || err != nil {
			t.Errorf("parseOSRelease(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
	}
	if _, err := parseOSRelease([]byte("NAME=x\n")); err == nil {
		t.Errorf("parseOSRelease() without PRETTY_NAME: no error")
	}
}

func TestDefaultRouteLinks(t *testing.T) {
	// As this machine's kernel showed them, plus a second link with an
	// IPv6 default route and a rejected one.
	route4 := `Iface	Destination	Gateway 	Flags	RefCnt	Use	Metric	Mask		MTU	Window	IRTT
eth0	00000000	010200C0	0003	0	0	0	00000000	0	0	0
eth0	000200C0	00000000	0001	0	0	0	00FFFFFF	0	0	0
`
	route6 := `fd000000000000000000000000000000 40 00000000000000000000000000000000 00 00000000000000000000000000000000 00000100 00000001 00000000 00000001     eth0
00000000000000000000000000000000 00 00000000000000000000000000000000 00 fd000000000000000000000000000001 00000400 00000002 00000000 00000003     eth0
00000000000000000000000000000000 00 00000000000000000000000000000000 00 fe800000000000000000000000000001 00000400 00000002 00000000 00000003     eth1
00000000000000000000000000000000 00 00000000000000000000000000000000 00 00000000000000000000000000000000 00000400 00000002 00000000 00000201     eth2
00000000000000000000000000000000 00 00000000000000000000000000000000 00 00000000000000000000000000000000 ffffffff 00000001 00000000 00200200       lo
`
	got := defaultRouteLinks([]byte(route4), []byte(route6))
	if diff := cmp.Diff([]string{"eth0", "eth1"}, got); diff != "" {
		t.Errorf("defaultRouteLinks() mismatch (-want +got):\n%s", diff)
	}
}

func TestNodeAddrs(t *testing.T) {
	in := []netip.Addr{
		netip.MustParseAddr("fd00::2"), netip.MustParseAddr("fe80::1"), netip.MustParseAddr("192.0.2.2"),
		netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("::ffff:10.0.0.1"), netip.MustParseAddr("192.0.2.2"),
	}
	want := []netip.Addr{netip.MustParseAddr("192.0.2.2"), netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("fd00::2")}
	if diff := cmp.Diff(want, nodeAddrs(in), cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
		t.Errorf("nodeAddrs() mismatch (-want +got):\n%s", diff)
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
