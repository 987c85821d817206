package kubelet

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cairn-os/cairn/agent/kubelet/pods"
	"github.com/cairn-os/cairn/test/poll"
)

// hostsHead is the start of the hosts file the kubelet writes for a pod
// with a network of its own.
const hostsHead = "# Kubernetes-managed hosts file.\n" +
	"127.0.0.1\tlocalhost\n" +
	"::1\tlocalhost ip6-localhost ip6-loopback\n" +
	"fe00::0\tip6-localnet\n" +
	"fe00::0\tip6-mcastprefix\n" +
	"fe00::1\tip6-allnodes\n" +
	"fe00::2\tip6-allrouters\n"

// TestPodSandbox proves, on a node of a real control plane running its
// pods on a real containerd, what the kubelet makes of a pod's sandbox:
// the /etc/hosts it writes for each container (the pod's IP with its
// hostname and FQDN, the hostAliases; the node's file on the host
// network; none where a container mounts its own), hostnameOverride, and
// the pod's sysctls, by dotted and by slashed names, as the container
// reads them in /proc/sys.
func TestPodSandbox(t *testing.T) {
	e, cfg := newPodEnv(t, "sandbox-1")
	cfg.Pods.ClusterDNS = &pods.ClusterDNS{Servers: []string{"10.96.0.10"}, Domain: "cluster.local"}
	start(t, cfg)
	e.testNodeReady(t)
	image := e.busyboxImage(t)
	podsDir := filepath.Join(cfg.Dir, "pods")

	t.Run("hosts file with hostname, FQDN and hostAliases; sysctls; none where the container mounts its own", func(t *testing.T) {
		e.testPodHosts(t, image, podsDir)
	})
	t.Run("hosts file on the host network: the node's with hostAliases", func(t *testing.T) { e.testHostNetworkHosts(t, image) })
	t.Run("hostnameOverride names the pod, in the kernel and in its hosts file", func(t *testing.T) { e.testHostnameOverride(t, image) })
}

func (e *podEnv) testPodHosts(t *testing.T, image, podsDir string) {
	sh := func(name, script string, mounts ...corev1.VolumeMount) corev1.Container {
		return corev1.Container{Name: name, Image: image, ImagePullPolicy: corev1.PullIfNotPresent,
			Command: []string{"/bin/busybox", "sh", "-c", "b=/bin/busybox; " + script}, VolumeMounts: mounts}
	}
	pod := e.createPod(t, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "hosts", Namespace: "default"},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Hostname:      "web", Subdomain: "sub",
			HostAliases: []corev1.HostAlias{{IP: "123.45.67.89", Hostnames: []string{"foo", "bar"}}},
			SecurityContext: &corev1.PodSecurityContext{Sysctls: []corev1.Sysctl{
				{Name: "kernel.shm_rmid_forced", Value: "1"},
				{Name: "net/ipv4/ip_unprivileged_port_start", Value: "1000"},
			}},
			Volumes: []corev1.Volume{{Name: "own", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
			Containers: []corev1.Container{
				sh("hosts", "$b cat /etc/hosts"),
				sh("names", "echo hostname=$($b hostname) shm_rmid_forced=$($b cat /proc/sys/kernel/shm_rmid_forced) "+
					"ip_unprivileged_port_start=$($b cat /proc/sys/net/ipv4/ip_unprivileged_port_start)"),
				sh("own", "test -d /etc/hosts && echo own hosts directory", corev1.VolumeMount{Name: "own", MountPath: "/etc/hosts"}),
			},
		},
	})
	p := e.waitSucceeded(t, pod)
	want := hostsHead + p.Status.PodIP + "\tweb.sub.default.svc.cluster.local\tweb\n" +
		"\n# Entries added by HostAliases.\n123.45.67.89\tfoo\tbar\n"
	if got := e.output(t, p, "hosts"); got != want {
		t.Errorf("/etc/hosts of a pod with IP %s:\n%s\nwant:\n%s", p.Status.PodIP, got, want)
	}
	if got, want := e.output(t, p, "names"), "hostname=web shm_rmid_forced=1 ip_unprivileged_port_start=1000\n"; got != want {
		t.Errorf("hostname and sysctls seen in the pod: %q, want %q", got, want)
	}
	if got, want := e.output(t, p, "own"), "own hosts directory\n"; got != want {
		t.Errorf("container mounting its own /etc/hosts printed %q, want %q", got, want)
	}
	hosts := filepath.Join(podsDir, string(p.UID), "etc-hosts")
	if _, err := os.Stat(hosts); err != nil {
		t.Errorf("the pod's hosts file on the node: %v", err)
	}
	e.deletePod(t, p)
	poll.Until(t, 30*time.Second, "the pod's hosts file removed", func() error {
		if _, err := os.Stat(hosts); !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("%s: %v", hosts, err)
		}
		return nil
	})
}

func (e *podEnv) testHostNetworkHosts(t *testing.T, image string) {
	node, err := os.ReadFile("/etc/hosts")
	if err != nil {
		t.Fatal(err)
	}
	pod := e.createPod(t, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "host-hosts", Namespace: "default"},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			HostNetwork:   true,
			HostAliases:   []corev1.HostAlias{{IP: "123.45.67.89", Hostnames: []string{"foo", "bar"}}},
			Containers: []corev1.Container{{Name: "hosts", Image: image, ImagePullPolicy: corev1.PullIfNotPresent,
				Command: []string{"/bin/busybox", "cat", "/etc/hosts"}}},
		},
	})
	p := e.waitSucceeded(t, pod)
	want := "# Kubernetes-managed hosts file (host network).\n" + string(node) + "\n# Entries added by HostAliases.\n123.45.67.89\tfoo\tbar\n"
	if got := e.output(t, p, "hosts"); got != want {
		t.Errorf("/etc/hosts of a pod on the host network:\n%s\nwant:\n%s", got, want)
	}
	e.deletePod(t, p)
}

func (e *podEnv) testHostnameOverride(t *testing.T, image string) {
	override := "override.example.host"
	pod := e.createPod(t, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "override", Namespace: "default"},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Hostname:      "web", HostnameOverride: &override,
			Containers: []corev1.Container{{Name: "names", Image: image, ImagePullPolicy: corev1.PullIfNotPresent,
				Command: []string{"/bin/busybox", "sh", "-c", "b=/bin/busybox; $b hostname; $b tail -n 1 /etc/hosts"}}},
		},
	})
	p := e.waitSucceeded(t, pod)
	if got, want := e.output(t, p, "names"), override+"\n"+p.Status.PodIP+"\t"+override+"\n"; got != want {
		t.Errorf("hostname and the pod's line of /etc/hosts: %q, want %q", got, want)
	}
	e.deletePod(t, p)
}

// waitSucceeded waits for pod to succeed and returns it.
func (e *podEnv) waitSucceeded(t *testing.T, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	p := waitPod(t, e.c.Client, pod.Namespace, pod.Name, 60*time.Second, "Succeeded", func(p *corev1.Pod) bool {
		return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
	})
	if p.Status.Phase != corev1.PodSucceeded {
		for _, cs := range p.Status.ContainerStatuses {
			if cs.ContainerID != "" {
				t.Logf("%s printed %q", cs.Name, e.output(t, p, cs.Name))
			}
		}
		t.Fatalf("pod %s %s: %+v", pod.Name, p.Status.Phase, p.Status.ContainerStatuses)
	}
	return p
}

// output is what container name of p printed, its lines joined.
func (e *podEnv) output(t *testing.T, p *corev1.Pod, name string) string {
	t.Helper()
	cs := containerStatusOf(p, name)
	if cs == nil || cs.ContainerID == "" {
		t.Fatalf("container %s of pod %s was not made: %+v", name, p.Name, cs)
	}
	var b strings.Builder
	for _, l := range lineTexts(logEntries(t, e.logPath(t, cs.ContainerID))) {
		b.WriteString(l + "\n")
	}
	return b.String()
}

// busyboxImage pushes probee's image with the host's static busybox
// (Debian's busybox-static) at /bin/busybox, for a shell, cat and
// hostname in the pod, and returns its reference.
func (e *podEnv) busyboxImage(t *testing.T) string {
	t.Helper()
	bin, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Fatalf("%v: install the Debian package busybox-static", err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range []*tar.Header{
		{Name: "bin/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "bin/busybox", Typeflag: tar.TypeReg, Mode: 0o755, Size: int64(len(bin))},
	} {
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := tw.Write(bin); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf.Bytes())), nil })
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	src, err := name.ParseReference(e.probee, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	img, err := remote.Image(src, remote.WithContext(ctx))
	if err != nil {
		t.Fatal(err)
	}
	if img, err = mutate.AppendLayers(img, layer); err != nil {
		t.Fatal(err)
	}
	ref := e.reg.Addr + "/cairn-test/busybox:v1"
	dst, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(dst, img, remote.WithContext(ctx)); err != nil {
		t.Fatal(err)
	}
	return ref
}
