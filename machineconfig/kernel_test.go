package machineconfig

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestParseTimeKernel reads machine.time and machine.kernel, and writes
// them back as they were read.
func TestParseTimeKernel(t *testing.T) {
	c, err := Parse([]byte(doc(t, header+machineSection+`  time:
    servers: [time.example.com, 192.0.2.1, "192.0.2.2:1123", "2001:db8::1", "[2001:db8::2]:123", NTP.Example.org.]
  kernel:
    args: [mitigations=off, "dyndbg=\"file x.c +p\"", nosmt, cgroup.memory=nokmem]
    modules: [dummy, nbd, ip_vs-rr]
`)))
	if err != nil {
		t.Fatalf("Parse() = %v", err)
	}
	want := Machine{
		Time: Time{Servers: []string{"time.example.com", "192.0.2.1", "192.0.2.2:1123", "2001:db8::1", "[2001:db8::2]:123", "NTP.Example.org."}},
		Kernel: Kernel{
			Args:    []string{"mitigations=off", `dyndbg="file x.c +p"`, "nosmt", "cgroup.memory=nokmem"},
			Modules: []string{"dummy", "nbd", "ip_vs-rr"},
		},
	}
	if diff := cmp.Diff(want.Time, c.Machine.Time); diff != "" {
		t.Errorf("time (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(want.Kernel, c.Machine.Kernel); diff != "" {
		t.Errorf("kernel (-want +got):\n%s", diff)
	}
	data, err := c.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	again, err := Parse(data)
	if err != nil {
		t.Fatalf("Parse(Marshal()) = %v\n%s", err, data)
	}
	if diff := cmp.Diff(c, again); diff != "" {
		t.Errorf("Parse(Marshal()) differs (-first +again):\n%s", diff)
	}
}

func TestParseTimeKernelInvalid(t *testing.T) {
	_, err := Parse([]byte(doc(t, header+machineSection+`  time:
    servers: ["", "bad host", "time.example.com:0", "time.example.com:x", "[2001:db8::1]", time.example.com, TIME.example.com, -x.example.com]
  kernel:
    args: ["", "a\nb", "two words", "x=\"unclosed", console=ttyS1, panic=0, rdinit=/bin/sh, noinitrd]
    modules: [dummy.ko, "", dummy, "dum my", nbd, nbd]
`)))
	var verr *ValidationError
	if !errors.As(err, &verr) {
		t.Fatalf("Parse() = %v, want a *ValidationError", err)
	}
	const notArg = "is not one argument: use name or name=value, each list item one argument, a value with spaces in double quotes"
	const notMod = "is not a module name: use letters, digits, '_' and '-', without .ko (e.g. dummy)"
	want := []FieldError{
		{"machine.time.servers[0]", "empty: give a host name or IP address"},
		{"machine.time.servers[1]", `"bad host" is not a host name or IP address`},
		{"machine.time.servers[2]", `"time.example.com:0" has a port out of range 1..65535`},
		{"machine.time.servers[3]", `"time.example.com:x" has a port out of range 1..65535`},
		{"machine.time.servers[4]", `"[2001:db8::1]" is not HOST or HOST:PORT (an IPv6 address with a port is written [ADDRESS]:PORT)`},
		{"machine.time.servers[6]", `"TIME.example.com" is machine.time.servers[5] already`},
		{"machine.time.servers[7]", `"-x.example.com" is not a host name or IP address`},
		{"machine.kernel.args[0]", "empty: give one argument, name or name=value"},
		{"machine.kernel.args[1]", `"a\nb" holds a line break: the command line is one line`},
		{"machine.kernel.args[2]", `"two words" ` + notArg},
		{"machine.kernel.args[3]", `"x=\"unclosed" ` + notArg},
		{"machine.kernel.args[4]", `"console=ttyS1" is Cairn's: the image sets the consoles init's boot log goes to; leave it out`},
		{"machine.kernel.args[5]", `"panic=0" is Cairn's: the image reboots the node after a panic, into the last good boot; leave it out`},
		{"machine.kernel.args[6]", `"rdinit=/bin/sh" is Cairn's: the image's initramfs runs init stage 1; leave it out`},
		{"machine.kernel.args[7]", `"noinitrd" is Cairn's: the root filesystem is in the initramfs; leave it out`},
		{"machine.kernel.modules[0]", `"dummy.ko" ` + notMod},
		{"machine.kernel.modules[1]", `"" ` + notMod},
		{"machine.kernel.modules[3]", `"dum my" ` + notMod},
		{"machine.kernel.modules[5]", `"nbd" is machine.kernel.modules[4] already`},
	}
	if diff := cmp.Diff(want, verr.Errors); diff != "" {
		t.Errorf("Parse() errors mismatch (-want +got):\n%s", diff)
	}
}

// TestKernelArgsLen refuses arguments longer in all than the kernel's
// command line leaves the machine's, and takes them up to it.
func TestKernelArgsLen(t *testing.T) {
	arg := "x=" + strings.Repeat("a", MaxKernelArgsLen-2)
	for _, tt := range []struct {
		args []string
		want []FieldError
	}{
		{args: []string{arg}},
		{args: []string{arg, "y"}, want: []FieldError{{"machine.kernel.args", fmt.Sprintf("%d bytes in all, more than %d: the kernel's command line is 2048 bytes with the image's own", MaxKernelArgsLen+2, MaxKernelArgsLen)}}},
	} {
		var v validator
		v.kernel(&Kernel{Args: tt.args})
		if diff := cmp.Diff(tt.want, v.errs); diff != "" {
			t.Errorf("kernel args of %d bytes: errors (-want +got):\n%s", len(strings.Join(tt.args, " ")), diff)
		}
	}
}
