package machineconfig

import (
	"fmt"
	"strings"
)

// Effect is when a change to a field of a running node's machine config
// takes effect.
type Effect int

// Effects of a change.
const (
	// Live changes are applied to the running node, with no reboot.
	Live Effect = iota + 1
	// Reboot changes take effect when the node next boots.
	Reboot
)

func (e Effect) String() string {
	switch e {
	case Live:
		return "live"
	case Reboot:
		return "reboot"
	}
	return fmt.Sprintf("Effect(%d)", int(e))
}

// effectRule is how changes at and below Path take effect.
type effectRule struct {
	Path   string
	Effect Effect
	// How says who applies the change and what it does, for the docs.
	How string
}

// effects is the one table of what a node applies live: each change
// takes the rule of the longest Path that holds it, and a field no rule
// names needs a reboot. docs/machine-config.md is generated from it
// (EffectsMarkdown).
var effects = []effectRule{
	{"machine.sysctls", Live, "init sets the new values; a parameter dropped from the config gets back the value it had before the node set it"},
	{"machine.files", Live, "init writes the files that changed, each whole or not at all; a file dropped from the config is removed"},
	{"machine.time.servers", Live, "init polls the new servers at once and keeps the clock in step with them; with none it stops polling"},
	{"machine.resources", Live, "init changes the cgroup limits of containerd and cairn-agent at once, without restarting them; a limit dropped is lifted, a memory limit below what the service uses is refused"},
	{"services", Live, "init starts an added service, stops a removed one, and stops and starts anew a changed one; the others keep running"},
	{"machine.staticPods", Live, "init rewrites the manifests; the agent starts, replaces or stops the pods"},
	{"containerd.registries", Live, "init rewrites containerd's hosts.toml files, which containerd reads at each pull"},
	{"network.interfaces[].addresses", Live, "init adds the new static addresses and removes the dropped ones"},
	{"network.interfaces[].routes", Live, "init adds the new routes and removes the dropped ones"},
	{"network.interfaces[].mtu", Live, "init sets the link's MTU"},
	{"network.interfaces[].vlans", Live, "init makes the new VLANs (with a DHCP client where asked), sets their addresses, routes and MTU, and deletes the dropped ones"},
	{"network.nameservers", Live, "init rewrites /etc/resolv.conf"},
	{"network.searchDomains", Live, "init rewrites /etc/resolv.conf"},
	{"network.extraHostEntries", Live, "init rewrites its part of /etc/hosts"},
	{"machine.api.ca", Live, "the agent checks the client certificates of new connections against the new CA; open connections keep theirs"},
	{"machine.api.cert", Live, "the agent presents the new certificate to new connections, the API's and the metrics'"},
	{"machine.api.key", Live, "with the certificate"},
	{"cluster.nodeLabels", Live, "the agent patches the Node's labels: sets the new ones, removes the dropped ones"},
}

// Effect says when c takes effect on a running node.
func (c Change) Effect() Effect {
	best := effectRule{Effect: Reboot}
	for _, r := range effects {
		if under(c.Path, r.Path) && len(r.Path) > len(best.Path) {
			best = r
		}
	}
	return best.Effect
}

// under reports whether the field path p is at or below the field path
// parent: machine.files[2].mode is below machine.files. In parent, []
// stands for any index: network.interfaces[1].addresses[0] is below
// network.interfaces[].addresses.
func under(p, parent string) bool {
	for {
		before, after, wild := strings.Cut(parent, "[]")
		rest, ok := strings.CutPrefix(p, before)
		if !ok {
			return false
		}
		if !wild {
			return rest == "" || rest[0] == '.' || rest[0] == '['
		}
		// An index: [digits].
		end := strings.IndexByte(rest, ']')
		if !strings.HasPrefix(rest, "[") || end < 2 || strings.Trim(rest[1:end], "0123456789") != "" {
			return false
		}
		p, parent = rest[end+1:], after
	}
}

// NeedsReboot returns the changes that take effect only at the next boot.
func NeedsReboot(changes []Change) []Change {
	var out []Change
	for _, c := range changes {
		if c.Effect() == Reboot {
			out = append(out, c)
		}
	}
	return out
}

// EffectsMarkdown is the effects table as the Markdown table of the docs.
func EffectsMarkdown() string {
	var b strings.Builder
	b.WriteString("| field | applied | how |\n| --- | --- | --- |\n")
	for _, r := range effects {
		fmt.Fprintf(&b, "| `%s` | %s | %s |\n", r.Path, r.Effect, r.How)
	}
	b.WriteString("| every other field | reboot | written to STATE, used from the next boot |\n")
	return b.String()
}
