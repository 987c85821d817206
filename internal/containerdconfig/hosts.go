package containerdconfig

import (
	"fmt"
	"net/url"
	"sort"
	"strconv"
	"strings"

	"github.com/cairn-os/cairn/machineconfig"
)

func hosts(r machineconfig.Registry) string {
	q := strconv.Quote
	var b strings.Builder
	b.WriteString("# Written by Cairn's init from the machine config.\n")
	// The registry itself is the server, tried after the mirrors; an
	// endpoint naming the registry's own host (e.g. http:// for a plain
	// HTTP registry) says how to reach it.
	server := "https://" + r.Host
	var mirrors []string
	for _, e := range r.Endpoints {
		if u, err := url.Parse(e); err == nil && u.Host == r.Host {
			server = e
		} else {
			mirrors = append(mirrors, e)
		}
	}
	fmt.Fprintf(&b, "server = %s\n", q(server))
	if r.InsecureSkipVerify {
		b.WriteString("skip_verify = true\n")
	}
	// Mirrors are tried in the order of their tables.
	for _, e := range mirrors {
		fmt.Fprintf(&b, "\n[host.%s]\n  capabilities = [\"pull\", \"resolve\"]\n", q(e))
		if r.InsecureSkipVerify {
			b.WriteString("  skip_verify = true\n")
		}
	}
	return b.String()
}

// SortedPaths lists the keys of files in order, for stable writes and logs.
func SortedPaths(files map[string][]byte) []string {
	paths := make([]string, 0, len(files))
	for p := range files {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	return paths
}
