package machineconfig

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestParseNetwork parses every network field: bonds by name and by MAC,
// VLANs, search domains and extra host entries.
func TestParseNetwork(t *testing.T) {
	c, err := Parse([]byte(doc(t, header+machineSection+`network:
  interfaces:
    - name: bond0
      bond:
        interfaces: [eth0]
        deviceSelectors: [{mac: "52:54:00:00:00:02"}]
        mode: 802.3ad
        miimon: 100
        lacpRate: fast
        xmitHashPolicy: layer3+4
      vlans:
        - vlanId: 100
          addresses: [192.0.2.10/24]
          routes: [{to: 0.0.0.0/0, via: 192.0.2.1}]
        - vlanId: 200
          dhcp: true
          mtu: 1400
  searchDomains: [corp.example.com, example.com]
  extraHostEntries:
    - ip: 192.0.2.5
      aliases: [registry.corp.example.com, registry]
`)))
	if err != nil {
		t.Fatalf("Parse() = %v", err)
	}
	want := Network{
		Interfaces: []Interface{{
			Name: "bond0",
			Bond: &Bond{Interfaces: []string{"eth0"}, DeviceSelectors: []DeviceSelector{{MAC: "52:54:00:00:00:02"}}, Mode: "802.3ad", MIIMon: 100, LACPRate: "fast", XmitHashPolicy: "layer3+4"},
			VLANs: []VLAN{
				{VLANID: 100, Addresses: []string{"192.0.2.10/24"}, Routes: []Route{{To: "0.0.0.0/0", Via: "192.0.2.1"}}},
				{VLANID: 200, DHCP: true, MTU: 1400},
			},
		}},
		SearchDomains:    []string{"corp.example.com", "example.com"},
		ExtraHostEntries: []HostEntry{{IP: "192.0.2.5", Aliases: []string{"registry.corp.example.com", "registry"}}},
	}
	if diff := cmp.Diff(want, c.Network); diff != "" {
		t.Errorf("Parse() network mismatch (-want +got):\n%s", diff)
	}
}

// TestParseNetworkInvalid refuses each bad network field with its path.
func TestParseNetworkInvalid(t *testing.T) {
	tests := []struct {
		name string
		doc  string
		want []FieldError
	}{
		{
			name: "vlans",
			doc: `network:
  interfaces:
    - name: eth0
      vlans:
        - {vlanId: 0, dhcp: true}
        - {vlanId: 4095, dhcp: true}
        - {vlanId: 10, dhcp: true}
        - {vlanId: 10, addresses: [192.0.2.1/24], mtu: 10}
        - {vlanId: 20}
    - name: ethernet-long
      vlans: [{vlanId: 4000, dhcp: true}]
`,
			want: []FieldError{
				{"network.interfaces[0].vlans[0].vlanId", "0 is out of range 1..4094"},
				{"network.interfaces[0].vlans[1].vlanId", "4095 is out of range 1..4094"},
				{"network.interfaces[0].vlans[3].vlanId", "10 is listed twice"},
				{"network.interfaces[0].vlans[3].mtu", "10 is out of range 68..65535 (or 0 to leave it as is)"},
				{"network.interfaces[0].vlans[4]", "needs dhcp: true or at least one address"},
				{"network.interfaces[1].vlans[0].vlanId", `"ethernet-long.4000" is not a valid interface name: use at most 15 characters, without '/', ':' or spaces`},
			},
		},
		{
			name: "bonds",
			doc: `network:
  interfaces:
    - name: bond0
      dhcp: true
      bond:
        interfaces: [eth0, eth1, eth0]
        deviceSelectors: [{mac: "52:54:00:00:00:02"}, {mac: "nope"}]
        mode: fast
        miimon: -1
        lacpRate: fast
        xmitHashPolicy: layer9
    - name: bond1
      dhcp: true
      bond: {interfaces: [eth1], mode: active-backup}
    - mac: "52-54-00-00-00-02"
      dhcp: true
    - mac: "52:54:00:00:00:03"
      dhcp: true
      bond: {mode: balance-rr}
`,
			want: []FieldError{
				{"network.interfaces[0].bond.interfaces[2]", `"eth0" is already selected by network.interfaces[0].bond.interfaces[0]`},
				{"network.interfaces[0].bond.deviceSelectors[1].mac", `"nope" is not a MAC address`},
				{"network.interfaces[0].bond.mode", `"fast" is not a bond mode; use one of balance-rr, active-backup, balance-xor, broadcast, 802.3ad, balance-tlb, balance-alb`},
				{"network.interfaces[0].bond.miimon", "-1 is negative"},
				{"network.interfaces[0].bond.lacpRate", "only for mode 802.3ad"},
				{"network.interfaces[0].bond.xmitHashPolicy", `"layer9" is not a transmit hash policy; use one of layer2, layer3+4, layer2+3, encap2+3, encap3+4, vlan+srcmac`},
				{"network.interfaces[1].bond.interfaces[0]", `"eth1" is already selected by network.interfaces[0].bond.interfaces[1]`},
				{"network.interfaces[2].mac", `"52-54-00-00-00-02" is already selected by network.interfaces[0].bond.deviceSelectors[0].mac`},
				{"network.interfaces[3]", "a bond needs a name (of the link to make) and no mac"},
				{"network.interfaces[3].bond", "needs members: interfaces or deviceSelectors"},
			},
		},
		{
			name: "a bond member before its bond",
			doc: `network:
  interfaces:
    - {name: eth0, dhcp: true}
    - name: bond0
      dhcp: true
      bond: {interfaces: [eth0], mode: active-backup}
`,
			want: []FieldError{{"network.interfaces[0].name", `"eth0" is already selected by network.interfaces[1].bond.interfaces[0]`}},
		},
		{
			name: "dns and hosts",
			doc: `network:
  interfaces: [{name: eth0, dhcp: true}]
  searchDomains: [example.com, "not a domain", -bad.example, example.com]
  extraHostEntries:
    - {ip: 192.0.2.5, aliases: [registry]}
    - {ip: 300.1.1.1, aliases: [under_score]}
    - {ip: "2001:db8::1"}
`,
			want: []FieldError{
				{"network.searchDomains[1]", `"not a domain" is not a DNS name: use labels of letters, digits and '-' separated by '.', at most 253 characters`},
				{"network.searchDomains[2]", `"-bad.example" is not a DNS name: use labels of letters, digits and '-' separated by '.', at most 253 characters`},
				{"network.searchDomains[3]", `"example.com" is listed twice`},
				{"network.extraHostEntries[1].ip", `"300.1.1.1" is not an IP address`},
				{"network.extraHostEntries[1].aliases[0]", `"under_score" is not a DNS name`},
				{"network.extraHostEntries[2].aliases", "required: at least one name"},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(doc(t, header+machineSection+tt.doc)))
			var verr *ValidationError
			if !errors.As(err, &verr) {
				t.Fatalf("Parse() = %v, want a *ValidationError", err)
			}
			if diff := cmp.Diff(tt.want, verr.Errors); diff != "" {
				t.Errorf("Parse() errors mismatch (-want +got):\n%s", diff)
			}
		})
	}
}
