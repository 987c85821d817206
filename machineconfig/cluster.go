package machineconfig

import (
	"encoding/base64"
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"regexp"
	"slices"
	"strings"

	"sigs.k8s.io/yaml"
)

// DefaultClusterDomain is the cluster's DNS domain unless configured.
const DefaultClusterDomain = "cluster.local"

// DefaultKubeletPort is the kubelet server's port unless configured.
const DefaultKubeletPort = 10250

// Cluster says how the node joins a Kubernetes cluster as a worker. Without
// it the node runs no kubelet.
//
// The node authenticates with exactly one of BootstrapToken or Kubeconfig.
// With BootstrapToken it reaches Server, trusting CA, and asks for its own
// client certificate (TLS bootstrapping); with Kubeconfig, the kubeconfig
// names the server, the CA and the node's credentials, and Server and CA
// stay empty.
type Cluster struct {
	// Server is the API server's URL, https://HOST[:PORT].
	Server string `json:"server,omitempty"`
	// CA is the PEM certificate of the cluster CA, which signed the API
	// server's serving certificate.
	CA string `json:"ca,omitempty"`
	// BootstrapToken is a bootstrap token, ID.SECRET: 6 and 16 lowercase
	// letters or digits.
	BootstrapToken string `json:"bootstrapToken,omitempty"`
	// Kubeconfig is a kubeconfig document with the node's credentials,
	// complete in itself: its current context names an https server, the
	// CA as certificate-authority-data, and a user with
	// client-certificate-data and client-key-data, or a token. Files, exec
	// plugins and auth providers are not supported.
	Kubeconfig string `json:"kubeconfig,omitempty"`
	// NodeLabels are added to the Node's labels. The API server lets a node
	// set labels under kubernetes.io/ and k8s.io/ only in the
	// node.kubernetes.io/ and kubelet.kubernetes.io/ namespaces, and
	// topology.kubernetes.io/zone and region; node roles are set from the
	// control plane.
	NodeLabels map[string]string `json:"nodeLabels,omitempty"`
	// NodeTaints are the Node's taints when it registers. A node may not
	// change its taints later: that is done from the control plane.
	NodeTaints []Taint `json:"nodeTaints,omitempty"`
	// PodCIDR, if set, is the Node's pod range when it registers; leave it
	// empty when kube-controller-manager allocates pod ranges.
	PodCIDR string `json:"podCIDR,omitempty"`
	// PodNetwork says how pods reach the pods of the cluster's other nodes.
	PodNetwork PodNetwork `json:"podNetwork,omitempty"`
	// ClusterCIDRs are the pod networks of the whole cluster, one per IP
	// family: Service traffic from outside them is masqueraded.
	ClusterCIDRs []string `json:"clusterCIDRs,omitempty"`
	// ServiceCIDRs are the cluster's Service ranges, one per IP family, if
	// given: a Node whose pod CIDR overlaps them is not routed to.
	ServiceCIDRs []string `json:"serviceCIDRs,omitempty"`
	// ClusterDNS are the IP addresses of the cluster's DNS service, for the
	// pods' resolv.conf.
	ClusterDNS []string `json:"clusterDNS,omitempty"`
	// ClusterDomain is the cluster's DNS domain; default cluster.local.
	ClusterDomain string `json:"clusterDomain,omitempty"`
	// NodeIP, if set, is the node's one InternalIP address, which the API
	// server reaches the kubelet server at; without it the node reports
	// the global unicast addresses of its default-route links.
	NodeIP string `json:"nodeIP,omitempty"`
	// KubeletPort is the TCP port of the kubelet server (logs through the
	// API server, kubectl logs); 0 means 10250, the kubelet's.
	KubeletPort int `json:"kubeletPort,omitempty"`
}

// PodNetwork says how the node routes to other nodes' pod CIDRs.
type PodNetwork struct {
	// Mode is auto (the default), host-gw or vxlan. With host-gw, another
	// node's pod CIDRs are routed through its InternalIP, which must be on
	// a network this node shares; with vxlan, they go through a VXLAN
	// device (UDP port 8472) to it, wherever it is; auto uses host-gw for
	// each node it shares a network with and vxlan for the others.
	Mode string `json:"mode,omitempty"`
}

// Pod network modes.
const (
	PodNetworkAuto   = "auto"
	PodNetworkHostGW = "host-gw"
	PodNetworkVXLAN  = "vxlan"
)

// Taint is a Node taint.
type Taint struct {
	Key   string `json:"key"`
	Value string `json:"value,omitempty"`
	// Effect is NoSchedule, PreferNoSchedule or NoExecute.
	Effect string `json:"effect"`
}

// Taint effects.
const (
	TaintNoSchedule       = "NoSchedule"
	TaintPreferNoSchedule = "PreferNoSchedule"
	TaintNoExecute        = "NoExecute"
)

func (c *Cluster) setDefaults() {
	if c == nil {
		return
	}
	if c.ClusterDomain == "" {
		c.ClusterDomain = DefaultClusterDomain
	}
	if c.KubeletPort == 0 {
		c.KubeletPort = DefaultKubeletPort
	}
	if c.PodNetwork.Mode == "" {
		c.PodNetwork.Mode = PodNetworkAuto
	}
}

var (
	bootstrapTokenRE = regexp.MustCompile(`^[a-z0-9]{6}\.[a-z0-9]{16}$`)
	// labelNameRE is the name part of a label key and a label value:
	// alphanumerics, '-', '_' and '.', starting and ending with an
	// alphanumeric.
	labelNameRE = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`)
	// dnsSubdomainRE is a lowercase RFC 1123 subdomain.
	dnsSubdomainRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
)

// Label keys that the node sets itself.
var nodeSetLabels = []string{"kubernetes.io/hostname", "kubernetes.io/os", "kubernetes.io/arch"}

func (v *validator) cluster(c *Cluster) {
	if c == nil {
		return
	}
	const p = "cluster"
	switch {
	case c.BootstrapToken == "" && c.Kubeconfig == "":
		v.add(p, "set bootstrapToken (with server and ca) or kubeconfig")
	case c.BootstrapToken != "" && c.Kubeconfig != "":
		v.add(p, "set only one of bootstrapToken or kubeconfig")
	case c.Kubeconfig != "":
		for _, f := range []struct{ name, val string }{{"server", c.Server}, {"ca", c.CA}} {
			if f.val != "" {
				v.add(p+"."+f.name, "must be empty with kubeconfig, which names the server and its CA")
			}
		}
		if err := checkKubeconfig(c.Kubeconfig); err != nil {
			v.add(p+".kubeconfig", "%v", err)
		}
	default:
		if c.Server == "" {
			v.add(p+".server", "required")
		} else if err := checkServerURL(c.Server); err != nil {
			v.add(p+".server", "%q %v", c.Server, err)
		}
		if ca := v.cert(p+".ca", c.CA); ca != nil && !ca.IsCA {
			v.add(p+".ca", "not a CA certificate")
		}
		if !bootstrapTokenRE.MatchString(c.BootstrapToken) {
			// The token is a secret: don't repeat it.
			v.add(p+".bootstrapToken", "not a bootstrap token: use ID.SECRET, 6 and 16 lowercase letters or digits")
		}
	}

	for _, k := range sortedKeys(c.NodeLabels) {
		v.nodeLabel(fmt.Sprintf("%s.nodeLabels[%q]", p, k), k, c.NodeLabels[k])
	}
	taints := map[string]string{} // key:effect → path of the taint
	for i, t := range c.NodeTaints {
		tp := fmt.Sprintf("%s.nodeTaints[%d]", p, i)
		if t.Key == "" {
			v.add(tp+".key", "required")
		} else if err := checkQualifiedName(t.Key); err != nil {
			v.add(tp+".key", "%q %v", t.Key, err)
		}
		if err := checkLabelValue(t.Value); err != nil {
			v.add(tp+".value", "%q %v", t.Value, err)
		}
		switch t.Effect {
		case TaintNoSchedule, TaintPreferNoSchedule, TaintNoExecute:
			id := t.Key + ":" + t.Effect
			if taints[id] != "" {
				v.add(tp, "%s is already set by %s", id, taints[id])
			}
			taints[id] = tp
		case "":
			v.add(tp+".effect", "required; use NoSchedule, PreferNoSchedule or NoExecute")
		default:
			v.add(tp+".effect", "%q is not one of NoSchedule, PreferNoSchedule, NoExecute", t.Effect)
		}
	}

	if c.PodCIDR != "" {
		pfx, err := netip.ParsePrefix(c.PodCIDR)
		switch {
		case err != nil:
			v.add(p+".podCIDR", "%q is not a CIDR", c.PodCIDR)
		case pfx.Masked() != pfx:
			v.add(p+".podCIDR", "%q has host bits set; use %q", c.PodCIDR, pfx.Masked())
		}
	}
	switch c.PodNetwork.Mode {
	case "", PodNetworkAuto, PodNetworkHostGW, PodNetworkVXLAN:
	default:
		v.add(p+".podNetwork.mode", "%q is not one of auto, host-gw, vxlan", c.PodNetwork.Mode)
	}
	v.cidrs(p+".clusterCIDRs", c.ClusterCIDRs)
	v.cidrs(p+".serviceCIDRs", c.ServiceCIDRs)
	for i, s := range c.ClusterDNS {
		if _, err := netip.ParseAddr(s); err != nil {
			v.add(fmt.Sprintf("%s.clusterDNS[%d]", p, i), "%q is not an IP address", s)
		}
	}
	if len(c.ClusterDomain) > 253 || !dnsSubdomainRE.MatchString(c.ClusterDomain) {
		v.add(p+".clusterDomain", "%q is not a DNS domain: use lowercase letters, digits, '-' and '.', without a trailing dot", c.ClusterDomain)
	}
	if c.NodeIP != "" {
		if ip, err := netip.ParseAddr(c.NodeIP); err != nil || ip.Zone() != "" || ip.IsUnspecified() {
			v.add(p+".nodeIP", "%q is not an IP address of the node", c.NodeIP)
		}
	}
	// 0 is the default, for a section validated before SetDefaults.
	if c.KubeletPort < 0 || c.KubeletPort > 65535 {
		v.add(p+".kubeletPort", "%d is out of range 1..65535", c.KubeletPort)
	}
}

// cidrs checks that each of list, at path p, is a network in CIDR form.
func (v *validator) cidrs(p string, list []string) {
	for i, s := range list {
		pfx, err := netip.ParsePrefix(s)
		switch {
		case err != nil:
			v.add(fmt.Sprintf("%s[%d]", p, i), "%q is not a CIDR", s)
		case pfx.Masked() != pfx:
			v.add(fmt.Sprintf("%s[%d]", p, i), "%q has host bits set; use %q", s, pfx.Masked())
		}
	}
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// checkServerURL checks that s is https://HOST[:PORT] with at most a path.
func checkServerURL(s string) error {
	u, err := url.Parse(s)
	switch {
	case err != nil || u.Scheme != "https" || u.Host == "" || u.Opaque != "":
		return errors.New("is not an https:// URL")
	case u.User != nil || u.RawQuery != "" || u.Fragment != "":
		return errors.New("has a user, query or fragment; use https://HOST[:PORT]")
	}
	return nil
}

func (v *validator) nodeLabel(path, key, value string) {
	if err := checkQualifiedName(key); err != nil {
		v.add(path, "key %v", err)
		return
	}
	if slices.Contains(nodeSetLabels, key) {
		v.add(path, "is set by the node itself")
		return
	}
	if err := nodeMaySetLabel(key); err != nil {
		v.add(path, "%v", err)
		return
	}
	if err := checkLabelValue(value); err != nil {
		v.add(path, "value %q %v", value, err)
	}
}

// checkQualifiedName checks a label or taint key: [PREFIX/]NAME with a DNS
// subdomain as PREFIX and NAME as labelNameRE, at most 63 characters.
func checkQualifiedName(s string) error {
	prefix, name, hasPrefix := strings.Cut(s, "/")
	if !hasPrefix {
		name, prefix = prefix, ""
	}
	if hasPrefix && (prefix == "" || len(prefix) > 253 || !dnsSubdomainRE.MatchString(prefix)) {
		return errors.New("has a prefix that is not a lowercase DNS subdomain")
	}
	if len(name) > 63 || !labelNameRE.MatchString(name) {
		return errors.New("is not [PREFIX/]NAME with a NAME of at most 63 letters, digits, '-', '_' and '.', starting and ending with a letter or digit")
	}
	return nil
}

// checkLabelValue checks a label or taint value: empty, or as labelNameRE
// and at most 63 characters.
func checkLabelValue(s string) error {
	if s != "" && (len(s) > 63 || !labelNameRE.MatchString(s)) {
		return errors.New("is not at most 63 letters, digits, '-', '_' and '.', starting and ending with a letter or digit")
	}
	return nil
}

// nodeMaySetLabel reports an error for a label key that the API server's
// NodeRestriction admission refuses from a node: one under kubernetes.io/
// or k8s.io/ (or their subdomains) outside the namespaces and keys that
// nodes own.
func nodeMaySetLabel(key string) error {
	prefix, _, _ := strings.Cut(key, "/")
	under := func(domain string) bool { return prefix == domain || strings.HasSuffix(prefix, "."+domain) }
	switch {
	case under("node-restriction.kubernetes.io"):
		return errors.New("is reserved for the control plane (node-restriction.kubernetes.io)")
	case !under("kubernetes.io") && !under("k8s.io"):
		return nil
	case under("node.kubernetes.io"), under("kubelet.kubernetes.io"),
		key == "topology.kubernetes.io/zone", key == "topology.kubernetes.io/region":
		return nil
	}
	return errors.New("is a kubernetes.io or k8s.io label that the API server refuses from a node; use node.kubernetes.io/, kubelet.kubernetes.io/ or your own prefix, and set node roles from the control plane")
}

// kubeconfig is the part of a kubeconfig document that checkKubeconfig
// reads; the agent reads the whole document with client-go.
type kubeconfig struct {
	CurrentContext string `json:"current-context"`
	Contexts       []struct {
		Name    string `json:"name"`
		Context struct {
			Cluster string `json:"cluster"`
			User    string `json:"user"`
		} `json:"context"`
	} `json:"contexts"`
	Clusters []struct {
		Name    string            `json:"name"`
		Cluster kubeconfigCluster `json:"cluster"`
	} `json:"clusters"`
	Users []struct {
		Name string         `json:"name"`
		User kubeconfigUser `json:"user"`
	} `json:"users"`
}

type kubeconfigCluster struct {
	Server                   string `json:"server"`
	CertificateAuthority     string `json:"certificate-authority"`
	CertificateAuthorityData string `json:"certificate-authority-data"`
	InsecureSkipTLSVerify    bool   `json:"insecure-skip-tls-verify"`
}

type kubeconfigUser struct {
	ClientCertificate     string `json:"client-certificate"`
	ClientCertificateData string `json:"client-certificate-data"`
	ClientKey             string `json:"client-key"`
	ClientKeyData         string `json:"client-key-data"`
	Token                 string `json:"token"`
	TokenFile             string `json:"tokenFile"`
	Exec                  any    `json:"exec"`
	AuthProvider          any    `json:"auth-provider"`
}

// checkKubeconfig checks that s is a kubeconfig whose current context is
// complete in itself (see Cluster.Kubeconfig).
func checkKubeconfig(s string) error {
	var kc kubeconfig
	if err := yaml.Unmarshal([]byte(s), &kc); err != nil {
		return fmt.Errorf("not a kubeconfig: %w", err)
	}
	if kc.CurrentContext == "" {
		return errors.New("current-context is required")
	}
	var clusterName, userName string
	found := false
	for _, c := range kc.Contexts {
		if c.Name == kc.CurrentContext {
			clusterName, userName, found = c.Context.Cluster, c.Context.User, true
		}
	}
	if !found {
		return fmt.Errorf("current-context %q is not in contexts", kc.CurrentContext)
	}
	for _, c := range kc.Clusters {
		if c.Name == clusterName {
			if err := checkKubeconfigCluster(&c.Cluster); err != nil {
				return fmt.Errorf("clusters[%q]: %w", clusterName, err)
			}
			for _, u := range kc.Users {
				if u.Name == userName {
					if err := checkKubeconfigUser(&u.User); err != nil {
						return fmt.Errorf("users[%q]: %w", userName, err)
					}
					return nil
				}
			}
			return fmt.Errorf("user %q of the current context is not in users", userName)
		}
	}
	return fmt.Errorf("cluster %q of the current context is not in clusters", clusterName)
}

func checkKubeconfigCluster(c *kubeconfigCluster) error {
	switch {
	case c.Server == "":
		return errors.New("server is required")
	case c.InsecureSkipTLSVerify:
		return errors.New("insecure-skip-tls-verify is not supported; give certificate-authority-data")
	case c.CertificateAuthority != "":
		return errors.New("certificate-authority names a file; give certificate-authority-data")
	case c.CertificateAuthorityData == "":
		return errors.New("certificate-authority-data is required")
	}
	if err := checkServerURL(c.Server); err != nil {
		return fmt.Errorf("server %q %w", c.Server, err)
	}
	if _, err := parseCertPEM(decodeBase64(c.CertificateAuthorityData)); err != nil {
		return fmt.Errorf("certificate-authority-data: %w", err)
	}
	return nil
}

func checkKubeconfigUser(u *kubeconfigUser) error {
	const want = "give client-certificate-data and client-key-data, or token"
	switch {
	case u.ClientCertificate != "" || u.ClientKey != "" || u.TokenFile != "":
		return fmt.Errorf("client-certificate, client-key and tokenFile name files; %s", want)
	case u.Exec != nil || u.AuthProvider != nil:
		return fmt.Errorf("exec and auth-provider are not supported; %s", want)
	case u.Token != "":
		return nil
	case u.ClientCertificateData == "" || u.ClientKeyData == "":
		return fmt.Errorf("no credentials; %s", want)
	}
	cert, err := parseCertPEM(decodeBase64(u.ClientCertificateData))
	if err != nil {
		return fmt.Errorf("client-certificate-data: %w", err)
	}
	key, err := parseKeyPEM(decodeBase64(u.ClientKeyData))
	if err != nil {
		return fmt.Errorf("client-key-data: %w", err)
	}
	if !keyMatches(cert, key) {
		return errors.New("client-key-data does not match client-certificate-data")
	}
	return nil
}

// decodeBase64 decodes a kubeconfig *-data field; what is not base64
// decodes to nothing, which the PEM parsers then refuse.
func decodeBase64(s string) []byte {
	b, _ := base64.StdEncoding.DecodeString(s)
	return b
}
