package stage2

import (
	"fmt"
	"maps"
	"net"
	"os"
	"slices"
	"strings"
	"sync"

	"github.com/cairn-os/cairn/machineconfig"
)

const (
	resolvConfPath = "/etc/resolv.conf"
	hostsPath      = "/etc/hosts"
	// hostsMarker starts the part of /etc/hosts that comes from
	// network.extraHostEntries, after the node's own lines (setHostname's).
	hostsMarker = "# network.extraHostEntries\n"
)

// resolver writes the node's resolv.conf from the machine config's
// nameservers and search domains and, for what the config leaves out,
// from the DHCP leases of the links.
type resolver struct {
	mu                   sync.Mutex
	nameservers, search  []string // the config's
	leaseNS, leaseSearch map[string][]string
}

func newResolver(n machineconfig.Network) *resolver {
	return &resolver{
		nameservers: n.Nameservers, search: n.SearchDomains,
		leaseNS: map[string][]string{}, leaseSearch: map[string][]string{},
	}
}

// setLease records the DNS settings of link's lease (none: the lease is
// gone) and rewrites resolv.conf.
func (r *resolver) setLease(link string, ns []net.IP, search []string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	servers := make([]string, len(ns))
	for i, ip := range ns {
		servers[i] = ip.String()
	}
	r.leaseNS[link], r.leaseSearch[link] = servers, search
	return r.write()
}

// setConfig takes the config's nameservers and search domains from n and
// rewrites resolv.conf.
func (r *resolver) setConfig(n machineconfig.Network) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.nameservers, r.search = n.Nameservers, n.SearchDomains
	return r.write()
}

// flush writes resolv.conf with what r has.
func (r *resolver) flush() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.write()
}

// write writes resolv.conf: the config's nameservers, else every lease's
// (links in name order); the config's search domains, else the leases'.
// r.mu is held.
func (r *resolver) write() error {
	ns, search := r.nameservers, r.search
	if len(ns) == 0 {
		ns = fromLeases(r.leaseNS)
	}
	if len(search) == 0 {
		search = fromLeases(r.leaseSearch)
	}
	var b strings.Builder
	if len(search) > 0 {
		fmt.Fprintf(&b, "search %s\n", strings.Join(search, " "))
	}
	for _, s := range ns {
		fmt.Fprintf(&b, "nameserver %s\n", s)
	}
	if err := os.WriteFile(resolvConfPath, []byte(b.String()), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", resolvConfPath, err)
	}
	return nil
}

// fromLeases merges the lists of the links' leases, in link name order,
// each item once.
func fromLeases(byLink map[string][]string) []string {
	var out []string
	for _, link := range slices.Sorted(maps.Keys(byLink)) {
		for _, s := range byLink[link] {
			if !slices.Contains(out, s) {
				out = append(out, s)
			}
		}
	}
	return out
}

// writeHostEntries puts entries in /etc/hosts after the node's own lines,
// replacing those a previous call put there.
func writeHostEntries(entries []machineconfig.HostEntry) error {
	data, err := os.ReadFile(hostsPath)
	if err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("read %s: %w", hostsPath, err)
	}
	own, _, _ := strings.Cut(string(data), hostsMarker)
	if len(entries) == 0 && len(own) == len(data) {
		return nil // nothing to add, nothing to remove
	}
	var b strings.Builder
	b.WriteString(own)
	if len(entries) > 0 {
		b.WriteString(hostsMarker)
		for _, e := range entries {
			fmt.Fprintf(&b, "%s %s\n", e.IP, strings.Join(e.Aliases, " "))
		}
	}
	if err := os.WriteFile(hostsPath, []byte(b.String()), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", hostsPath, err)
	}
	return nil
}
