package host

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// ReadMemory reads the machine's memory from /proc/meminfo.
func ReadMemory() (Memory, error) {
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return Memory{}, err
	}
	return parseMeminfo(data)
}

// StatFS measures the filesystem that holds path.
func StatFS(path string) (Filesystem, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return Filesystem{}, &os.PathError{Op: "statfs", Path: path, Err: err}
	}
	bsize := uint64(st.Frsize)
	if bsize == 0 {
		bsize = uint64(st.Bsize)
	}
	return Filesystem{
		Size: st.Blocks * bsize, Free: st.Bavail * bsize,
		Inodes: st.Files, InodesFree: st.Ffree,
	}, nil
}

// ReadPIDs counts the tasks on the machine (/proc/loadavg) against
// kernel.pid_max.
func ReadPIDs() (PIDs, error) {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return PIDs{}, err
	}
	used, err := parseTasks(data)
	if err != nil {
		return PIDs{}, err
	}
	data, err = os.ReadFile("/proc/sys/kernel/pid_max")
	if err != nil {
		return PIDs{}, err
	}
	pidMax, err := strconv.ParseUint(strings.TrimSpace(string(data)), 10, 64)
	if err != nil {
		return PIDs{}, fmt.Errorf("kernel.pid_max: %w", err)
	}
	return PIDs{Used: used, Max: pidMax}, nil
}

// KernelVersion returns the kernel release, as uname -r prints it.
func KernelVersion() (string, error) {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "", fmt.Errorf("uname: %w", err)
	}
	return unix.ByteSliceToString(u.Release[:]), nil
}

// OSImage returns PRETTY_NAME of /etc/os-release, or else of
// /usr/lib/os-release.
func OSImage() (string, error) {
	data, err := os.ReadFile("/etc/os-release")
	if os.IsNotExist(err) {
		data, err = os.ReadFile("/usr/lib/os-release")
	}
	if err != nil {
		return "", err
	}
	return parseOSRelease(data)
}

// MachineID returns the ID in /etc/machine-id; an error satisfying
// errors.Is(err, fs.ErrNotExist) when there is none.
func MachineID() (string, error) {
	return readID("/etc/machine-id")
}

// BootID returns the kernel's ID of this boot.
func BootID() (string, error) {
	return readID("/proc/sys/kernel/random/boot_id")
}

func readID(path string) (string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	id := strings.TrimSpace(string(data))
	if id == "" {
		return "", fmt.Errorf("%s is empty", path)
	}
	return id, nil
}

// Addresses returns the addresses the node is reached at: the global
// unicast addresses of the links that carry a default route, or, without
// a default route, of every link that is up and not loopback. IPv4 comes
// first.
func Addresses() ([]netip.Addr, error) {
	route4, err4 := os.ReadFile("/proc/net/route")
	route6, err6 := os.ReadFile("/proc/net/ipv6_route") // absent without IPv6
	if err4 != nil && err6 != nil {
		return nil, fmt.Errorf("read routes: %w", err4)
	}
	var links []net.Interface
	for _, name := range defaultRouteLinks(route4, route6) {
		if l, err := net.InterfaceByName(name); err == nil {
			links = append(links, *l)
		}
	}
	if len(links) == 0 {
		all, err := net.Interfaces()
		if err != nil {
			return nil, fmt.Errorf("list links: %w", err)
		}
		for _, l := range all {
			if l.Flags&net.FlagUp != 0 && l.Flags&net.FlagLoopback == 0 {
				links = append(links, l)
			}
		}
	}
	var addrs []netip.Addr
	for _, l := range links {
		as, err := l.Addrs()
		if err != nil {
			return nil, fmt.Errorf("addresses of %s: %w", l.Name, err)
		}
		for _, a := range as {
			if n, ok := a.(*net.IPNet); ok {
				if ip, ok := netip.AddrFromSlice(n.IP); ok {
					addrs = append(addrs, ip)
				}
			}
		}
	}
	return nodeAddrs(addrs), nil
}
