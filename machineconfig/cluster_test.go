package machineconfig

import (
	"encoding/base64"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

const testToken = "abcdef.0123456789abcdef"

// kubeconfigDoc returns a kubeconfig with a new CA and a client
// certificate and key from it, changed by edit (old → new pairs) and
// quoted as a YAML string.
func kubeconfigDoc(t *testing.T, edit ...string) string {
	t.Helper()
	ca, err := NewCA("kube ca", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	cert, key, err := ca.IssueClient("system:node:node-1", RoleReader, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	b64 := func(b []byte) string { return base64.StdEncoding.EncodeToString(b) }
	kc := `apiVersion: v1
kind: Config
current-context: node
contexts:
- name: node
  context: {cluster: kube, user: node-1}
clusters:
- name: kube
  cluster:
    server: https://10.0.2.2:6443
    certificate-authority-data: ` + b64(ca.CertPEM) + `
users:
- name: node-1
  user:
    client-certificate-data: ` + b64(cert) + `
    client-key-data: ` + b64(key) + `
`
	kc = strings.NewReplacer(edit...).Replace(kc)
	return strconv.Quote(kc)
}

func TestClusterValid(t *testing.T) {
	f := testFixture(t)
	tests := []struct {
		name    string
		section string
		want    *Cluster
	}{
		{
			name: "bootstrap token with defaults",
			section: `cluster:
  server: https://10.0.2.2:6443
  ca: $CA
  bootstrapToken: ` + testToken + `
`,
			want: &Cluster{Server: "https://10.0.2.2:6443", CA: f.ca, BootstrapToken: testToken, ClusterDomain: DefaultClusterDomain, KubeletPort: DefaultKubeletPort,
				PodNetwork: PodNetwork{Mode: PodNetworkAuto}},
		},
		{
			name: "everything",
			section: `cluster:
  server: https://kube.example.com
  ca: $CA
  bootstrapToken: ` + testToken + `
  nodeLabels:
    example.com/rack: r12
    node.kubernetes.io/pool: gpu
    topology.kubernetes.io/zone: z1
    plain: ""
  nodeTaints:
    - {key: example.com/dedicated, value: gpu, effect: NoSchedule}
    - {key: example.com/dedicated, value: gpu, effect: NoExecute}
    - {key: spot, effect: PreferNoSchedule}
  podCIDR: 10.244.3.0/24
  podNetwork: {mode: vxlan}
  serviceCIDRs: ["10.96.0.0/12"]
  clusterDNS: ["10.96.0.10", "fd00:10:96::a"]
  clusterDomain: k8s.example.com
  nodeIP: 192.168.1.10
  kubeletPort: 10350
`,
			want: &Cluster{
				Server: "https://kube.example.com", CA: f.ca, BootstrapToken: testToken,
				NodeLabels: map[string]string{
					"example.com/rack": "r12", "node.kubernetes.io/pool": "gpu",
					"topology.kubernetes.io/zone": "z1", "plain": "",
				},
				NodeTaints: []Taint{
					{Key: "example.com/dedicated", Value: "gpu", Effect: TaintNoSchedule},
					{Key: "example.com/dedicated", Value: "gpu", Effect: TaintNoExecute},
					{Key: "spot", Effect: TaintPreferNoSchedule},
				},
				PodCIDR:       "10.244.3.0/24",
				PodNetwork:    PodNetwork{Mode: PodNetworkVXLAN},
				ServiceCIDRs:  []string{"10.96.0.0/12"},
				ClusterDNS:    []string{"10.96.0.10", "fd00:10:96::a"},
				ClusterDomain: "k8s.example.com",
				NodeIP:        "192.168.1.10",
				KubeletPort:   10350,
			},
		},
		{
			name:    "kubeconfig",
			section: "cluster:\n  kubeconfig: " + kubeconfigDoc(t) + "\n",
		},
		{
			name: "kubeconfig with a token",
			section: "cluster:\n  kubeconfig: " + kubeconfigDoc(t,
				"    client-certificate-data:", "    token: abc\n    x-certificate-data:",
				"    client-key-data:", "    x-key-data:") + "\n",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse([]byte(doc(t, header+machineSection+tt.section)))
			if err != nil {
				t.Fatalf("Parse() = %v", err)
			}
			if tt.want == nil {
				return
			}
			if diff := cmp.Diff(tt.want, c.Cluster); diff != "" {
				t.Errorf("Parse() cluster mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestClusterAbsent(t *testing.T) {
	c, err := Parse([]byte(doc(t, header+machineSection)))
	if err != nil {
		t.Fatalf("Parse() = %v", err)
	}
	if c.Cluster != nil {
		t.Errorf("Parse() without a cluster section: Cluster = %+v, want nil", c.Cluster)
	}
}

func TestClusterInvalid(t *testing.T) {
	tokenServer := "  server: https://10.0.2.2:6443\n  ca: $CA\n  bootstrapToken: " + testToken + "\n"
	tests := []struct {
		name    string
		section string
		want    []FieldError
	}{
		{
			name:    "node IP and kubelet port",
			section: "cluster:\n" + tokenServer + "  nodeIP: 10.0.0.300\n  kubeletPort: 70000\n  podNetwork: {mode: gre}\n",
			want: []FieldError{
				{"cluster.podNetwork.mode", `"gre" is not one of auto, host-gw, vxlan`},
				{"cluster.nodeIP", `"10.0.0.300" is not an IP address of the node`},
				{"cluster.kubeletPort", "70000 is out of range 1..65535"},
			},
		},
		{
			name:    "no credentials",
			section: "cluster:\n  server: https://10.0.2.2:6443\n  ca: $CA\n",
			want:    []FieldError{{"cluster", "set bootstrapToken (with server and ca) or kubeconfig"}},
		},
		{
			name:    "both credentials",
			section: "cluster:\n" + tokenServer + "  kubeconfig: x\n",
			want:    []FieldError{{"cluster", "set only one of bootstrapToken or kubeconfig"}},
		},
		{
			name: "bad token section",
			section: `cluster:
  server: http://10.0.2.2:6443
  ca: $CERT
  bootstrapToken: ABCDEF.0123456789abcdef
`,
			want: []FieldError{
				{"cluster.server", `"http://10.0.2.2:6443" is not an https:// URL`},
				{"cluster.ca", "not a CA certificate"},
				{"cluster.bootstrapToken", "not a bootstrap token: use ID.SECRET, 6 and 16 lowercase letters or digits"},
			},
		},
		{
			name:    "missing server and ca",
			section: "cluster:\n  bootstrapToken: " + testToken + "\n",
			want: []FieldError{
				{"cluster.server", "required"},
				{"cluster.ca", "required"},
			},
		},
		{
			name:    "server with a query",
			section: "cluster:\n  server: https://u@10.0.2.2:6443/?x=1\n  ca: $CA\n  bootstrapToken: " + testToken + "\n",
			want:    []FieldError{{"cluster.server", `"https://u@10.0.2.2:6443/?x=1" has a user, query or fragment; use https://HOST[:PORT]`}},
		},
		{
			name: "labels",
			section: "cluster:\n" + tokenServer + `  nodeLabels:
    node-role.kubernetes.io/worker: ""
    kubernetes.io/hostname: other
    node-restriction.kubernetes.io/trusted: "yes"
    Example.com/x: "1"
    example.com/too-long-value: "` + strings.Repeat("v", 64) + `"
    "-bad": x
    node.kubernetes.io/ok: "a b"
`,
			want: []FieldError{
				{`cluster.nodeLabels["-bad"]`, "key is not [PREFIX/]NAME with a NAME of at most 63 letters, digits, '-', '_' and '.', starting and ending with a letter or digit"},
				{`cluster.nodeLabels["Example.com/x"]`, "key has a prefix that is not a lowercase DNS subdomain"},
				{`cluster.nodeLabels["example.com/too-long-value"]`, `value "` + strings.Repeat("v", 64) + `" is not at most 63 letters, digits, '-', '_' and '.', starting and ending with a letter or digit`},
				{`cluster.nodeLabels["kubernetes.io/hostname"]`, "is set by the node itself"},
				{`cluster.nodeLabels["node-restriction.kubernetes.io/trusted"]`, "is reserved for the control plane (node-restriction.kubernetes.io)"},
				{`cluster.nodeLabels["node-role.kubernetes.io/worker"]`, "is a kubernetes.io or k8s.io label that the API server refuses from a node; use node.kubernetes.io/, kubelet.kubernetes.io/ or your own prefix, and set node roles from the control plane"},
				{`cluster.nodeLabels["node.kubernetes.io/ok"]`, `value "a b" is not at most 63 letters, digits, '-', '_' and '.', starting and ending with a letter or digit`},
			},
		},
		{
			name: "taints",
			section: "cluster:\n" + tokenServer + `  nodeTaints:
    - {key: dedicated, value: gpu, effect: NoSchedule}
    - {key: dedicated, value: cpu, effect: NoSchedule}
    - {value: x, effect: NoExecute}
    - {key: a/b/c, value: "x y", effect: Never}
    - {key: spot}
`,
			want: []FieldError{
				{"cluster.nodeTaints[1]", "dedicated:NoSchedule is already set by cluster.nodeTaints[0]"},
				{"cluster.nodeTaints[2].key", "required"},
				{"cluster.nodeTaints[3].key", `"a/b/c" is not [PREFIX/]NAME with a NAME of at most 63 letters, digits, '-', '_' and '.', starting and ending with a letter or digit`},
				{"cluster.nodeTaints[3].value", `"x y" is not at most 63 letters, digits, '-', '_' and '.', starting and ending with a letter or digit`},
				{"cluster.nodeTaints[3].effect", `"Never" is not one of NoSchedule, PreferNoSchedule, NoExecute`},
				{"cluster.nodeTaints[4].effect", "required; use NoSchedule, PreferNoSchedule or NoExecute"},
			},
		},
		{
			name: "networking",
			section: "cluster:\n" + tokenServer + `  podCIDR: 10.244.3.1/24
  clusterCIDRs: ["10.244.0.0/16", "10.245.1.0/16", "pods"]
  serviceCIDRs: ["10.96.0.0/12", "10.96.0.1/12"]
  clusterDNS: ["10.96.0.10", "dns"]
  clusterDomain: Cluster.Local.
`,
			want: []FieldError{
				{"cluster.podCIDR", `"10.244.3.1/24" has host bits set; use "10.244.3.0/24"`},
				{"cluster.clusterCIDRs[1]", `"10.245.1.0/16" has host bits set; use "10.245.0.0/16"`},
				{"cluster.clusterCIDRs[2]", `"pods" is not a CIDR`},
				{"cluster.serviceCIDRs[1]", `"10.96.0.1/12" has host bits set; use "10.96.0.0/12"`},
				{"cluster.clusterDNS[1]", `"dns" is not an IP address`},
				{"cluster.clusterDomain", `"Cluster.Local." is not a DNS domain: use lowercase letters, digits, '-' and '.', without a trailing dot`},
			},
		},
		{
			name:    "kubeconfig with server and ca",
			section: "cluster:\n  server: https://10.0.2.2:6443\n  ca: $CA\n  kubeconfig: " + kubeconfigDoc(t) + "\n",
			want: []FieldError{
				{"cluster.server", "must be empty with kubeconfig, which names the server and its CA"},
				{"cluster.ca", "must be empty with kubeconfig, which names the server and its CA"},
			},
		},
		{
			name:    "kubeconfig not YAML",
			section: "cluster:\n  kubeconfig: \"[\"\n",
			want:    []FieldError{{"cluster.kubeconfig", "not a kubeconfig: error converting YAML to JSON: yaml: line 1: did not find expected node content"}},
		},
		{
			name:    "kubeconfig without current context",
			section: "cluster:\n  kubeconfig: " + kubeconfigDoc(t, "current-context: node\n", "") + "\n",
			want:    []FieldError{{"cluster.kubeconfig", "current-context is required"}},
		},
		{
			name:    "kubeconfig context missing",
			section: "cluster:\n  kubeconfig: " + kubeconfigDoc(t, "current-context: node", "current-context: other") + "\n",
			want:    []FieldError{{"cluster.kubeconfig", `current-context "other" is not in contexts`}},
		},
		{
			name:    "kubeconfig cluster missing",
			section: "cluster:\n  kubeconfig: " + kubeconfigDoc(t, "- name: kube", "- name: kube2") + "\n",
			want:    []FieldError{{"cluster.kubeconfig", `cluster "kube" of the current context is not in clusters`}},
		},
		{
			name:    "kubeconfig user missing",
			section: "cluster:\n  kubeconfig: " + kubeconfigDoc(t, "- name: node-1", "- name: node-2") + "\n",
			want:    []FieldError{{"cluster.kubeconfig", `user "node-1" of the current context is not in users`}},
		},
		{
			name:    "kubeconfig with plain HTTP",
			section: "cluster:\n  kubeconfig: " + kubeconfigDoc(t, "https://", "http://") + "\n",
			want:    []FieldError{{"cluster.kubeconfig", `clusters["kube"]: server "http://10.0.2.2:6443" is not an https:// URL`}},
		},
		{
			name:    "kubeconfig with a CA file",
			section: "cluster:\n  kubeconfig: " + kubeconfigDoc(t, "certificate-authority-data:", "certificate-authority: /etc/ca.crt\n    x:") + "\n",
			want:    []FieldError{{"cluster.kubeconfig", `clusters["kube"]: certificate-authority names a file; give certificate-authority-data`}},
		},
		{
			name:    "kubeconfig without verification",
			section: "cluster:\n  kubeconfig: " + kubeconfigDoc(t, "    server:", "    insecure-skip-tls-verify: true\n    server:") + "\n",
			want:    []FieldError{{"cluster.kubeconfig", `clusters["kube"]: insecure-skip-tls-verify is not supported; give certificate-authority-data`}},
		},
		{
			name:    "kubeconfig with exec",
			section: "cluster:\n  kubeconfig: " + kubeconfigDoc(t, "  user:\n", "  user:\n    exec: {command: get-token}\n") + "\n",
			want:    []FieldError{{"cluster.kubeconfig", `users["node-1"]: exec and auth-provider are not supported; give client-certificate-data and client-key-data, or token`}},
		},
		{
			name:    "kubeconfig with a key file",
			section: "cluster:\n  kubeconfig: " + kubeconfigDoc(t, "client-key-data:", "client-key: /etc/key.pem\n    x:") + "\n",
			want:    []FieldError{{"cluster.kubeconfig", `users["node-1"]: client-certificate, client-key and tokenFile name files; give client-certificate-data and client-key-data, or token`}},
		},
		{
			name:    "kubeconfig without a key",
			section: "cluster:\n  kubeconfig: " + kubeconfigDoc(t, "client-key-data:", "x:") + "\n",
			want:    []FieldError{{"cluster.kubeconfig", `users["node-1"]: no credentials; give client-certificate-data and client-key-data, or token`}},
		},
		{
			name:    "kubeconfig with a bad certificate",
			section: "cluster:\n  kubeconfig: " + kubeconfigDoc(t, "client-certificate-data: ", "client-certificate-data: eA==\n    x: ") + "\n",
			want:    []FieldError{{"cluster.kubeconfig", `users["node-1"]: client-certificate-data: not a PEM certificate`}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(doc(t, header+machineSection+tt.section)))
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

func TestClusterKubeconfigKeyMismatch(t *testing.T) {
	other, err := NewCA("other", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	// A key of another certificate, in place of the client key.
	_, otherKey, err := other.IssueClient("system:node:node-1", RoleReader, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	kc, err := strconv.Unquote(kubeconfigDoc(t))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(kc, "\n")
	for i, l := range lines {
		if strings.HasPrefix(l, "    client-key-data: ") {
			lines[i] = "    client-key-data: " + base64.StdEncoding.EncodeToString(otherKey)
		}
	}
	_, err = Parse([]byte(doc(t, header+machineSection+"cluster:\n  kubeconfig: "+strconv.Quote(strings.Join(lines, "\n"))+"\n")))
	var verr *ValidationError
	if !errors.As(err, &verr) {
		t.Fatalf("Parse() = %v, want a *ValidationError", err)
	}
	want := []FieldError{{"cluster.kubeconfig", `users["node-1"]: client-key-data does not match client-certificate-data`}}
	if diff := cmp.Diff(want, verr.Errors); diff != "" {
		t.Errorf("Parse() errors mismatch (-want +got):\n%s", diff)
	}
}
