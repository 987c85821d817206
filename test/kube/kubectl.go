package kube

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/cairn-os/cairn/test/need"
)

// Kubectl runs the kubectl built with the control plane (make cluster)
// against the cluster, as one user, in one namespace.
type Kubectl struct {
	// Path is the binary's.
	Path string
	// Kubeconfig is the user's.
	Kubeconfig string
	// Namespace is passed as --namespace unless empty.
	Namespace string
	// Env is added to kubectl's environment, such as
	// KUBECTL_REMOTE_COMMAND_WEBSOCKETS=false for SPDY.
	Env []string
}

// Kubectl returns a kubectl for the admin (system:masters) in namespace ns;
// it skips or fails tb as Start does if kubectl is not built.
func (c *Cluster) Kubectl(tb testing.TB, ns string) *Kubectl {
	tb.Helper()
	return &Kubectl{Path: kubectlPath(tb), Kubeconfig: c.AdminKubeconfig, Namespace: ns}
}

// UserKubectl returns a kubectl for a user authenticated by a client
// certificate of the cluster CA, in namespace ns. With no user it sends no
// credentials: the anonymous user.
func (c *Cluster) UserKubectl(tb testing.TB, ns, user string, groups ...string) *Kubectl {
	tb.Helper()
	auth := &clientcmdapi.AuthInfo{}
	if user != "" {
		certPEM, keyPEM, err := c.IssueClient(user, groups...)
		if err != nil {
			tb.Fatalf("kube: %v", err)
		}
		auth.ClientCertificateData, auth.ClientKeyData = certPEM, keyPEM
	}
	path := filepath.Join(tb.TempDir(), "kubeconfig")
	if err := c.WriteKubeconfig(path, "", auth); err != nil {
		tb.Fatalf("kube: %v", err)
	}
	return &Kubectl{Path: kubectlPath(tb), Kubeconfig: path, Namespace: ns}
}

// Direct returns a kubectl for the same user that talks to server, a
// kubelet's https://HOST:PORT, rather than to the API server, without
// checking the server's certificate: a node's is self-signed until the
// cluster issues one.
func (k *Kubectl) Direct(tb testing.TB, server string) *Kubectl {
	tb.Helper()
	cfg, err := clientcmd.LoadFromFile(k.Kubeconfig)
	if err != nil {
		tb.Fatalf("kube: %v", err)
	}
	for _, cl := range cfg.Clusters {
		cl.Server, cl.CertificateAuthorityData, cl.InsecureSkipTLSVerify = server, nil, true
	}
	path := filepath.Join(tb.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		tb.Fatalf("kube: write kubeconfig %s: %v", path, err)
	}
	return &Kubectl{Path: k.Path, Kubeconfig: path, Namespace: k.Namespace, Env: k.Env}
}

// kubectlPath is kubectl's path beside the control plane's binaries.
func kubectlPath(tb testing.TB) string {
	tb.Helper()
	path := filepath.Join(binaries(tb, Options{}), "kubectl")
	need.Built(tb, path, "cluster", EnvBin)
	return path
}

// Command returns the command of kubectl with args, for a caller that
// wires its own stdio; it is killed when ctx ends.
func (k *Kubectl) Command(ctx context.Context, args ...string) *exec.Cmd {
	all := []string{"--kubeconfig", k.Kubeconfig}
	if k.Namespace != "" {
		all = append(all, "--namespace", k.Namespace)
	}
	cmd := exec.CommandContext(ctx, k.Path, append(all, args...)...)
	cmd.Env = append(os.Environ(), k.Env...)
	return cmd
}

// Run runs kubectl with args and stdin (nil: none) and returns its
// stdout; an error says the exit status and has stderr. The exit code is
// that of errors.As(err, *exec.ExitError).
func (k *Kubectl) Run(ctx context.Context, stdin []byte, args ...string) (string, error) {
	cmd := k.Command(ctx, args...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}
