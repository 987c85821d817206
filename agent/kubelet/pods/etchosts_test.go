package pods

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"
)

const localhosts = "# Kubernetes-managed hosts file.\n" +
	"127.0.0.1\tlocalhost\n" +
	"::1\tlocalhost ip6-localhost ip6-loopback\n" +
	"fe00::0\tip6-localnet\n" +
	"fe00::0\tip6-mcastprefix\n" +
	"fe00::1\tip6-allnodes\n" +
	"fe00::2\tip6-allrouters\n"

func TestHostsContent(t *testing.T) {
	aliases := []corev1.HostAlias{{IP: "123.45.67.89", Hostnames: []string{"foo", "bar"}}, {IP: "::2", Hostnames: []string{"six"}}}
	for _, tc := range []struct {
		name string
		got  []byte
		want string
	}{
		{"pod", podHosts("10.1.0.5", "web", "", nil), localhosts + "10.1.0.5\tweb\n"},
		{"pod with a domain: FQDN first", podHosts("10.1.0.5", "web", "sub.ns.svc.cluster.local", nil),
			localhosts + "10.1.0.5\tweb.sub.ns.svc.cluster.local\tweb\n"},
		{"pod with hostAliases", podHosts("10.1.0.5", "web", "", aliases),
			localhosts + "10.1.0.5\tweb\n\n# Entries added by HostAliases.\n123.45.67.89\tfoo\tbar\n::2\tsix\n"},
		{"host network: the node's file", hostNetworkHosts([]byte("127.0.0.1 localhost\n"), nil),
			"# Kubernetes-managed hosts file (host network).\n127.0.0.1 localhost\n"},
		{"host network with hostAliases", hostNetworkHosts([]byte("127.0.0.1 localhost\n"), aliases[:1]),
			"# Kubernetes-managed hosts file (host network).\n127.0.0.1 localhost\n\n# Entries added by HostAliases.\n123.45.67.89\tfoo\tbar\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, string(tc.got)); diff != "" {
				t.Errorf("hosts file (-want +got):\n%s", diff)
			}
		})
	}
}

// TestEtcHostsMount writes the hosts files of real pods in a temporary
// pods directory and checks which containers get them mounted.
func TestEtcHostsMount(t *testing.T) {
	dir := t.TempDir()
	w := &Worker{cfg: Config{LogRoot: t.TempDir(), PodsDir: dir, ClusterDNS: &ClusterDNS{Servers: []string{"10.96.0.10"}, Domain: "cluster.local"}}}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web-0", Namespace: "ns", UID: "uid-1"},
		Spec: corev1.PodSpec{Hostname: "web", Subdomain: "sub",
			HostAliases: []corev1.HostAlias{{IP: "123.45.67.89", Hostnames: []string{"foo", "bar"}}}},
	}
	path := filepath.Join(dir, "uid-1", "etc-hosts")

	got, err := w.etcHostsMount(pod, &corev1.Container{Name: "app"}, "10.1.0.5")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(&criv1.Mount{ContainerPath: "/etc/hosts", HostPath: path}, got, protocmp.Transform()); diff != "" {
		t.Errorf("mount (-want +got):\n%s", diff)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want := localhosts + "10.1.0.5\tweb.sub.ns.svc.cluster.local\tweb\n\n# Entries added by HostAliases.\n123.45.67.89\tfoo\tbar\n"
	if diff := cmp.Diff(want, string(b)); diff != "" {
		t.Errorf("%s (-want +got):\n%s", path, diff)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o644 {
		t.Errorf("%s: %v, %v; want mode 0644", path, fi.Mode(), err)
	}

	// A new sandbox's IP rewrites the file in place: running containers
	// bind-mount its inode.
	before, _ := os.Stat(path)
	if _, err := w.etcHostsMount(pod, &corev1.Container{Name: "app"}, "10.1.0.6"); err != nil {
		t.Fatal(err)
	}
	after, _ := os.Stat(path)
	if b, _ := os.ReadFile(path); !strings.Contains(string(b), "10.1.0.6\tweb.sub") || !os.SameFile(before, after) {
		t.Errorf("after a new IP, %s holds %q (same file %v), want the new IP in the same file", path, b, os.SameFile(before, after))
	}

	own := &corev1.Container{Name: "own", VolumeMounts: []corev1.VolumeMount{{Name: "h", MountPath: "/etc/hosts"}}}
	for _, tc := range []struct {
		name  string
		pod   *corev1.Pod
		c     *corev1.Container
		ip    string
		dir   string
		wants bool
	}{
		{"container mounting its own /etc/hosts", pod, own, "10.1.0.5", dir, false},
		{"pod without an IP", pod, &corev1.Container{}, "", dir, false},
		{"worker without a pods directory", pod, &corev1.Container{}, "10.1.0.5", "", false},
		{"pod on the host network, which has no IP of its own", &corev1.Pod{ObjectMeta: metav1.ObjectMeta{UID: "uid-2"},
			Spec: corev1.PodSpec{HostNetwork: true}}, &corev1.Container{}, "", dir, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := &Worker{cfg: Config{LogRoot: w.cfg.LogRoot, PodsDir: tc.dir}}
			got, err := w.etcHostsMount(tc.pod, tc.c, tc.ip)
			if err != nil || (got != nil) != tc.wants {
				t.Errorf("etcHostsMount = %v, %v; want a mount: %v", got, err, tc.wants)
			}
		})
	}
	node, err := os.ReadFile("/etc/hosts")
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "uid-2", "etc-hosts")); err != nil || string(b) != hostsHeaderHost+string(node) {
		t.Errorf("host network pod's hosts file: %q, %v; want the header and the node's /etc/hosts", b, err)
	}
}
