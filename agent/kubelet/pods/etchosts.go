package pods

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	corev1 "k8s.io/api/core/v1"
	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// The kubelet's managed hosts file: where containers see it, its name in
// the pod's directory, its headers, and the node's hosts file that a pod
// on the host network gets.
const (
	etcHosts         = "/etc/hosts"
	etcHostsFile     = "etc-hosts"
	hostsHeader      = "# Kubernetes-managed hosts file.\n"
	hostsHeaderHost  = "# Kubernetes-managed hosts file (host network).\n"
	nodeEtcHostsPath = "/etc/hosts"
)

// etcHostsMount writes the pod's hosts file and returns its mount at
// /etc/hosts in c, as the kubelet gives one to every container of a pod
// that has an IP or is on the host network; nil, and nothing written, if
// the worker has no PodsDir, the pod no IP, or c mounts a volume at
// /etc/hosts itself.
func (w *Worker) etcHostsMount(pod *corev1.Pod, c *corev1.Container, podIP string) (*criv1.Mount, error) {
	if w.cfg.PodsDir == "" || podIP == "" && !pod.Spec.HostNetwork {
		return nil, nil
	}
	for _, vm := range c.VolumeMounts {
		if filepath.Clean(vm.MountPath) == etcHosts {
			return nil, nil
		}
	}
	var content []byte
	if pod.Spec.HostNetwork {
		node, err := os.ReadFile(nodeEtcHostsPath)
		if err != nil {
			return nil, fmt.Errorf("hosts file of a pod on the host network: %w", err)
		}
		content = hostNetworkHosts(node, pod.Spec.HostAliases)
	} else {
		host, domain := w.podHostname(pod)
		content = podHosts(podIP, host, domain, pod.Spec.HostAliases)
	}
	dir := filepath.Join(w.cfg.PodsDir, string(pod.UID))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("pod's hosts file: %w", err)
	}
	path := filepath.Join(dir, etcHostsFile)
	if err := writeChanged(path, content); err != nil {
		return nil, fmt.Errorf("pod's hosts file: %w", err)
	}
	return &criv1.Mount{ContainerPath: etcHosts, HostPath: path}, nil
}

// writeChanged writes content to the file path unless it holds it already.
// It writes in place, not by a rename: the containers that run bind-mount
// the file itself, and see the change only so.
func writeChanged(path string, content []byte) error {
	old, err := os.ReadFile(path)
	if err == nil && bytes.Equal(old, content) {
		return nil
	}
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if err := os.WriteFile(path, content, 0o644); err != nil {
		return err
	}
	return os.Chmod(path, 0o644) // whatever the umask: non-root containers read it
}

// podHosts is the hosts file of a pod with its own network, as the kubelet
// writes it: its header, the localhost entries, the pod's IP with its
// name (its FQDN first if it has a domain), and its hostAliases.
func podHosts(ip, host, domain string, aliases []corev1.HostAlias) []byte {
	var b bytes.Buffer
	b.WriteString(hostsHeader)
	b.WriteString("127.0.0.1\tlocalhost\n")
	b.WriteString("::1\tlocalhost ip6-localhost ip6-loopback\n")
	b.WriteString("fe00::0\tip6-localnet\n")
	b.WriteString("fe00::0\tip6-mcastprefix\n")
	b.WriteString("fe00::1\tip6-allnodes\n")
	b.WriteString("fe00::2\tip6-allrouters\n")
	if domain != "" {
		fmt.Fprintf(&b, "%s\t%s.%s\t%s\n", ip, host, domain, host)
	} else {
		fmt.Fprintf(&b, "%s\t%s\n", ip, host)
	}
	writeAliases(&b, aliases)
	return b.Bytes()
}

// hostNetworkHosts is the hosts file of a pod on the host network: its
// header, the node's hosts file and the pod's hostAliases.
func hostNetworkHosts(node []byte, aliases []corev1.HostAlias) []byte {
	var b bytes.Buffer
	b.WriteString(hostsHeaderHost)
	b.Write(node)
	writeAliases(&b, aliases)
	return b.Bytes()
}

// writeAliases appends the hostAliases, a line per IP with its names.
func writeAliases(b *bytes.Buffer, aliases []corev1.HostAlias) {
	if len(aliases) == 0 {
		return
	}
	b.WriteString("\n# Entries added by HostAliases.\n")
	for _, a := range aliases {
		fmt.Fprintf(b, "%s\t%s\n", a.IP, strings.Join(a.Hostnames, "\t"))
	}
}
