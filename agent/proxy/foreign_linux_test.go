package proxy

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/nftables"

	"github.com/cairn-os/cairn/test/need"
)

// foreignRuleset is what other software keeps in the node's namespace,
// written with nft(8): tables of every IP family, one named cairn in
// family ip and ip6, one whose name starts with cairn, with chains, sets,
// maps and base chains named like the proxier's own. None of it changes
// packets that the tests send.
const foreignRuleset = `
table inet cairn2 {
	set service-ips4 {
		type ipv4_addr . inet_proto . inet_service
		elements = { 198.18.100.10 . tcp . 80, 198.18.100.99 . udp . 53 }
	}
	map cluster-ips4 {
		type ipv4_addr : verdict
		elements = { 198.18.100.10 : goto services }
	}
	chain services {
		ip daddr . meta l4proto . th dport @service-ips4 accept
	}
	chain nat-prerouting {
		type nat hook prerouting priority dstnat; policy accept;
		ip daddr vmap @cluster-ips4
	}
}
table ip cairn {
	set cluster-ips4 {
		type ipv4_addr
		flags interval
		elements = { 198.18.100.0/24 }
	}
	chain services {
		ip daddr @cluster-ips4 return
	}
	chain filter-prerouting {
		type filter hook prerouting priority -90; policy accept;
		jump services
	}
}
table ip6 cairn {
	set cluster-ips6 {
		type ipv6_addr
		elements = { fd00:18:100::10 }
	}
	chain services {
		ip6 daddr @cluster-ips6 return
	}
	chain nat-output {
		type nat hook output priority -100; policy accept;
		jump services
	}
}
table inet filter {
	chain input {
		type filter hook input priority filter; policy accept;
		ct state established,related accept
	}
}
`

// foreignObjects lists, from nft -j list ruleset in ns, every object that
// is not of table inet cairn, each as the JSON nft printed for it.
func foreignObjects(t *testing.T, ns *netNS) []string {
	t.Helper()
	out, err := exec.Command("ip", "netns", "exec", ns.name, "nft", "-j", "list", "ruleset").Output()
	if err != nil {
		t.Fatalf("nft -j list ruleset: %v", err)
	}
	var doc struct {
		Nftables []map[string]json.RawMessage `json:"nftables"`
	}
	if err := json.Unmarshal(out, &doc); err != nil {
		t.Fatalf("nft -j list ruleset: %v\n%s", err, out)
	}
	var objs []string
	for _, o := range doc.Nftables {
		for kind, raw := range o {
			var id struct{ Family, Table, Name string }
			if err := json.Unmarshal(raw, &id); err != nil {
				t.Fatalf("nft object %s: %v", kind, err)
			}
			if kind == "metainfo" || id.Family == "inet" && (id.Table == defaultTable || kind == "table" && id.Name == defaultTable) {
				continue
			}
			objs = append(objs, kind+" "+string(raw))
		}
	}
	return objs
}

// TestForeignTablesUntouched writes tables of other owners into the
// node's namespace and runs the proxier over them: its first full sync,
// changes, periodic full syncs and Cleanup leave every one of their
// objects, handles included, as nft lists them.
func TestForeignTablesUntouched(t *testing.T) {
	need.Tool(t, "nft", "nftables")
	e := newEnv(t, 2)
	e.cfg.ResyncPeriod = 300 * time.Millisecond
	cmd := exec.Command("ip", "netns", "exec", e.node.name, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(foreignRuleset)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nft -f (the foreign tables): %v\n%s", err, out)
	}
	want := foreignObjects(t, e.node)
	all := strings.Join(want, "\n")
	for _, tbl := range []string{`"family": "inet", "name": "cairn2"`, `"family": "ip", "name": "cairn"`, `"family": "ip6", "name": "cairn"`, `"family": "inet", "name": "filter"`} {
		if !strings.Contains(all, tbl) {
			t.Fatalf("the foreign objects lack the table %s: the comparison would not see it\n%s", tbl, all)
		}
	}
	untouched := func(after string) {
		t.Helper()
		if diff := cmp.Diff(want, foreignObjects(t, e.node)); diff != "" {
			t.Errorf("after %s, the foreign tables differ (-before +after):\n%s", after, diff)
		}
	}

	p, stop := e.start()
	untouched("the first, full, sync")
	e.applyMixedServices()
	waitAnswers(t, e.client, webAddr)
	untouched("adding Services")

	e.apply(endpointSlice("web", httpPort, ep(backendIP(1))))
	e.deleteService("dns")
	eventually(t, "dns's chains gone and web on be1 only", func() error {
		for _, c := range kernelChains(t, e.node) {
			if strings.Contains(c, "/dns/") || strings.Contains(c, "/web/tcp/http/"+backendIP(0)) {
				return fmt.Errorf("chain %s still there", c)
			}
		}
		return nil
	})
	untouched("changing and deleting Services")

	full := p.Stats().FullSyncs
	eventually(t, "two periodic full syncs", func() error {
		if n := p.Stats().FullSyncs - full; n < 2 {
			return fmt.Errorf("%d so far", n)
		}
		return nil
	})
	untouched("periodic full syncs")

	stop()
	for i := range 2 { // the second finds no table of its own
		if err := New(e.cfg, e.kube).Cleanup(); err != nil {
			t.Fatalf("Cleanup: %v", err)
		}
		untouched(fmt.Sprintf("Cleanup %d", i+1))
	}
	if _, err := nodeConn(t, e.node).ListTableOfFamily(defaultTable, nftables.TableFamilyINet); err == nil {
		t.Errorf("table inet %s still there after Cleanup", defaultTable)
	}
}
