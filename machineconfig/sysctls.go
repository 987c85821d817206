package machineconfig

import (
	"fmt"
	"regexp"
	"strings"
)

// ownedSysctls are kernel parameters that Cairn sets itself, by their path
// under /proc/sys, with who sets them: a machine sysctl would fight it.
var ownedSysctls = map[string]string{
	"kernel/hostname": "init, from machine.hostname",
	// The pod network routes through the node: the bridge CNI plugin of
	// the agent's pod network turns forwarding on, and Services need it.
	"net/ipv4/ip_forward":          "the pod network",
	"net/ipv4/conf/all/forwarding": "the pod network", // ip_forward too
	"net/ipv6/conf/all/forwarding": "the pod network",
}

// sysctlPartRE is one part of a sysctl's name: what the kernel's own
// names and link names hold ('.' only in the '/' form).
var sysctlPartRE = regexp.MustCompile(`^[A-Za-z0-9_@:+-]+$`)

// SysctlPath returns the file of the sysctl name relative to /proc/sys:
// "net.ipv4.ip_forward" and "net/ipv4/ip_forward" are both
// "net/ipv4/ip_forward". Names are split on '/' when they hold one, else
// on '.', as sysctl(8) does.
func SysctlPath(name string) string {
	if strings.Contains(name, "/") {
		return name
	}
	return strings.ReplaceAll(name, ".", "/")
}

// checkSysctlName says what is wrong with name, or "". Which names the
// kernel has depends on the kernel and its modules, so only the form is
// checked here; init reports a name with no file at boot.
func checkSysctlName(name string) string {
	p := SysctlPath(name)
	parts := strings.Split(p, "/")
	if len(parts) < 2 {
		return "is not a sysctl name: use at least two parts, e.g. vm.swappiness"
	}
	for _, part := range parts {
		if part == "." || part == ".." || !sysctlPartRE.MatchString(strings.ReplaceAll(part, ".", "_")) {
			return "is not a sysctl name: use parts of letters, digits, '_' and '-' separated by '.' (or by '/' when a part holds a '.')"
		}
	}
	if who, ok := ownedSysctls[p]; ok {
		return "is set by " + who + ": leave it out"
	}
	return ""
}

func (v *validator) sysctls(sysctls map[string]string) {
	paths := map[string]string{} // path under /proc/sys → the name that set it
	for _, name := range sortedKeys(sysctls) {
		p := fmt.Sprintf("machine.sysctls[%q]", name)
		if msg := checkSysctlName(name); msg != "" {
			v.add(p, "%q %s", name, msg)
			continue
		}
		if other, dup := paths[SysctlPath(name)]; dup {
			v.add(p, "%q is %q already, written another way", name, other)
		}
		paths[SysctlPath(name)] = name
		if val := sysctls[name]; strings.TrimSpace(val) == "" || strings.ContainsAny(val, "\n\r") {
			v.add(p, "value %q: give one line, not empty", val)
		}
	}
}
