// Package host measures the machine for its Node object: memory,
// filesystem space, process IDs, kernel and OS identity, and the addresses
// the node is reached at. It reads what Linux shows in /proc, /etc and
// statfs(2); elsewhere its readers return ErrUnsupported.
package host

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// ErrUnsupported is returned by the readers on systems other than Linux.
var ErrUnsupported = errors.New("not supported on this system")

// Memory is the machine's memory in bytes.
type Memory struct {
	// Total is the usable RAM (MemTotal).
	Total uint64
	// Available is what can be allocated without swapping (MemAvailable).
	Available uint64
}

// Filesystem is the size of a filesystem and what an unprivileged user
// may still use of it.
type Filesystem struct {
	Size, Free         uint64 // bytes
	Inodes, InodesFree uint64
}

// PIDs counts process IDs: every task (thread) takes one of Max.
type PIDs struct {
	Used, Max uint64
}

// parseMeminfo reads MemTotal and MemAvailable from /proc/meminfo.
func parseMeminfo(data []byte) (Memory, error) {
	var m Memory
	var found int
	s := bufio.NewScanner(bytes.NewReader(data))
	for s.Scan() {
		name, rest, ok := strings.Cut(s.Text(), ":")
		var dst *uint64
		switch {
		case !ok:
			continue
		case name == "MemTotal":
			dst = &m.Total
		case name == "MemAvailable":
			dst = &m.Available
		default:
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return Memory{}, fmt.Errorf("meminfo: %s: %q is not a size in kB", name, strings.TrimSpace(rest))
		}
		kb, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil {
			return Memory{}, fmt.Errorf("meminfo: %s: %w", name, err)
		}
		*dst = kb * 1024
		found++
	}
	if found != 2 {
		return Memory{}, errors.New("meminfo: no MemTotal or MemAvailable")
	}
	return m, nil
}

// parseTasks reads the number of tasks from /proc/loadavg, the total
// after the slash in its fourth field ("1/107").
func parseTasks(data []byte) (uint64, error) {
	f := strings.Fields(string(data))
	if len(f) < 4 {
		return 0, fmt.Errorf("loadavg: %q has no task count", data)
	}
	_, total, ok := strings.Cut(f[3], "/")
	n, err := strconv.ParseUint(total, 10, 64)
	if !ok || err != nil {
		return 0, fmt.Errorf("loadavg: %q is not running/total tasks", f[3])
	}
	return n, nil
}

// parseOSRelease returns PRETTY_NAME from an os-release file, unquoted.
func parseOSRelease(data []byte) (string, error) {
	s := bufio.NewScanner(bytes.NewReader(data))
	for s.Scan() {
		v, ok := strings.CutPrefix(strings.TrimSpace(s.Text()), "PRETTY_NAME=")
		if !ok {
			continue
		}
		if len(v) >= 2 && (v[0] == '"' || v[0] == '\'') && v[len(v)-1] == v[0] {
			quote := v[0]
			v = v[1 : len(v)-1]
			if quote == '"' {
				// Shell double quotes: \" \\ \$ \` stand for the character.
				var b strings.Builder
				for i := 0; i < len(v); i++ {
					if v[i] == '\\' && i+1 < len(v) && strings.IndexByte("\"\\$`", v[i+1]) >= 0 {
						i++
					}
					b.WriteByte(v[i])
				}
				v = b.String()
			}
		}
		return v, nil
	}
	return "", errors.New("os-release: no PRETTY_NAME")
}

// defaultRouteLinks returns the links that carry a default route, IPv4
// first, from /proc/net/route and /proc/net/ipv6_route; routes through
// loopback and unreachable routes do not count.
func defaultRouteLinks(route4, route6 []byte) []string {
	var links []string
	add := func(link string) {
		if link != "lo" && !slices.Contains(links, link) {
			links = append(links, link)
		}
	}
	const rtfUp, rtfReject = 0x1, 0x200
	// Iface Destination Gateway Flags RefCnt Use Metric Mask …
	s := bufio.NewScanner(bytes.NewReader(route4))
	for s.Scan() {
		f := strings.Fields(s.Text())
		if len(f) < 8 || f[1] != "00000000" || f[7] != "00000000" {
			continue
		}
		if flags, err := strconv.ParseUint(f[3], 16, 32); err == nil && flags&rtfUp != 0 && flags&rtfReject == 0 {
			add(f[0])
		}
	}
	// Destination PrefixLen Source PrefixLen NextHop Metric RefCnt Use Flags Iface
	zero := strings.Repeat("0", 32)
	s = bufio.NewScanner(bytes.NewReader(route6))
	for s.Scan() {
		f := strings.Fields(s.Text())
		if len(f) < 10 || f[0] != zero || f[1] != "00" {
			continue
		}
		if flags, err := strconv.ParseUint(f[8], 16, 32); err == nil && flags&rtfUp != 0 && flags&rtfReject == 0 {
			add(f[9])
		}
	}
	return links
}

// nodeAddrs keeps the global unicast addresses of addrs, IPv4 first, each
// once, in order otherwise.
func nodeAddrs(addrs []netip.Addr) []netip.Addr {
	var v4, v6 []netip.Addr
	for _, a := range addrs {
		a = a.Unmap()
		switch {
		case !a.IsGlobalUnicast() || slices.Contains(v4, a) || slices.Contains(v6, a):
		case a.Is4():
			v4 = append(v4, a)
		default:
			v6 = append(v6, a)
		}
	}
	return append(v4, v6...)
}
