package server

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/creack/pty"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"

	"github.com/cairn-os/cairn/agent/node"
	"github.com/cairn-os/cairn/test/kube"
	"github.com/cairn-os/cairn/test/poll"
)

// kubectlPods is the test's pods on a node with a real containerd: "app"
// with a container "app" that serves HTTP on 8080 and echoes its stdin,
// and a container "done" that exited; "logs" with a container that
// prints "early", then "late" 5 s later and four ticks, and exits 3, over
// and over.
func kubectlPods(t *testing.T, ctx context.Context) *criNode {
	t.Helper()
	n := startCRINode(t)
	image := n.image(t, ctx, "./agent/kubelet/server/testdata/streamer")
	n.createPod(t, ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "app"},
		Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{
			{Name: "app", Image: image, Args: []string{"serve"}, Stdin: true},
			{Name: "done", Image: image, Args: []string{"exit", "0"}},
		}},
	})
	n.createPod(t, ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "logs"},
		Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyAlways, Containers: []corev1.Container{
			{Name: "logs", Image: image, Args: []string{"logs"}},
		}},
	})
	poll.Until(t, 90*time.Second, "app running and done exited", func() error {
		p, err := n.c.Client.CoreV1().Pods(n.ns).Get(ctx, "app", metav1.GetOptions{})
		if err != nil {
			return err
		}
		var running, exited bool
		for _, st := range p.Status.ContainerStatuses {
			running = running || st.Name == "app" && st.State.Running != nil
			exited = exited || st.Name == "done" && st.State.Terminated != nil
		}
		if !running || !exited {
			return fmt.Errorf("container statuses %+v", p.Status.ContainerStatuses)
		}
		return nil
	})
	return n
}

// protocols are kubectl's two ways to stream: WebSocket (its default
// since 1.30, which the API server turns into SPDY toward the node) and
// SPDY all the way.
var protocols = []struct {
	name string
	env  []string
}{
	{"websocket", nil},
	{"spdy", []string{"KUBECTL_REMOTE_COMMAND_WEBSOCKETS=false", "KUBECTL_PORT_FORWARD_WEBSOCKETS=false"}},
}

// TestKubectl runs the real kubectl through the API server against a node
// whose pods a real containerd runs: exec, attach, port-forward and cp
// with both of kubectl's protocols, logs, what the node refuses, and a
// client that goes away mid-stream.
func TestKubectl(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 8*time.Minute)
	defer cancel()
	n := kubectlPods(t, ctx)
	admin := n.c.Kubectl(t, n.ns)

	// First, while the container's restarts are still close together.
	t.Run("logs", func(t *testing.T) { testKubectlLogs(t, ctx, admin) })
	for _, p := range protocols {
		k := *admin
		k.Env = p.env
		t.Run(p.name+"/exec exit code", func(t *testing.T) {
			cmd := k.Command(ctx, "exec", "app", "-c", "app", "--", "streamer", "exit", "7")
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			err := cmd.Run()
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() != 7 || !strings.Contains(stderr.String(), "exiting 7") {
				t.Errorf("kubectl exec -- streamer exit 7 = %v, stderr %q; want exit code 7 and the command's stderr", err, stderr.String())
			}
		})
		t.Run(p.name+"/exec stdin", func(t *testing.T) {
			out, err := k.Run(ctx, []byte("hello\nworld\n"), "exec", "-i", "app", "-c", "app", "--", "streamer", "cat")
			if err != nil || out != "hello\nworld\neof\n" {
				t.Errorf("kubectl exec -i -- streamer cat = %q, %v; want the input, then eof", out, err)
			}
		})
		t.Run(p.name+"/exec tty", func(t *testing.T) { testExecTTY(t, ctx, &k) })
		t.Run(p.name+"/attach", func(t *testing.T) { testAttach(t, ctx, &k) })
		t.Run(p.name+"/port-forward", func(t *testing.T) { testPortForward(t, ctx, &k) })
		t.Run(p.name+"/cp", func(t *testing.T) {
			dir := t.TempDir()
			want := []byte("copied through the kubelet server\n")
			if err := os.WriteFile(filepath.Join(dir, "in.txt"), want, 0o644); err != nil {
				t.Fatal(err)
			}
			remote := "/tmp/" + p.name + ".txt"
			if _, err := k.Run(ctx, nil, "cp", filepath.Join(dir, "in.txt"), "app:"+remote, "-c", "app"); err != nil {
				t.Fatal(err)
			}
			if _, err := k.Run(ctx, nil, "cp", "app:"+remote, filepath.Join(dir, "out.txt"), "-c", "app"); err != nil {
				t.Fatal(err)
			}
			got, err := os.ReadFile(filepath.Join(dir, "out.txt"))
			if err != nil || !bytes.Equal(got, want) {
				t.Errorf("kubectl cp to the pod and back = %q, %v; want %q", got, err, want)
			}
		})
	}

	// The node declares ExtendWebSocketsToKubelet: the API server hands
	// kubectl's WebSocket streams on as they are, and the server above
	// translated them.
	t.Run("websocket proxied to the node", func(t *testing.T) {
		raw, err := n.c.Client.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, sub := range []string{"exec", "attach", "portforward"} {
			re := regexp.MustCompile(`(?m)^apiserver_websocket_streaming_requests_total\{proxy_type="proxied_to_kubelet",subresource="` + sub + `"\} ([0-9]+)`)
			if m := re.FindSubmatch(raw); m == nil || string(m[1]) == "0" {
				t.Errorf("the API server proxied no WebSocket %s to the node (apiserver_websocket_streaming_requests_total): it translated them itself", sub)
			}
		}
	})

	t.Run("exec stopped container", func(t *testing.T) {
		// The runtime's answer, at once: the container is not running.
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		_, err := admin.Run(cctx, nil, "exec", "app", "-c", "done", "--", "streamer", "exit", "0")
		if err == nil || cctx.Err() != nil || !strings.Contains(err.Error(), "CONTAINER_EXITED") {
			t.Errorf("kubectl exec into an exited container = %v; want the runtime's error within 30 s", err)
		}
	})
	t.Run("refused", func(t *testing.T) { testRefused(t, ctx, n) })
	t.Run("direct websocket", func(t *testing.T) { testDirectWebSocket(t, ctx, n) })
	t.Run("server stop", func(t *testing.T) { testServerStop(t, ctx, n) })
	t.Run("client gone", func(t *testing.T) { testClientGone(t, ctx, admin) })
}

// testExecTTY runs kubectl exec -it in a terminal of its own, resizes the
// terminal and sees the container's terminal resized.
func testExecTTY(t *testing.T, ctx context.Context, k *kube.Kubectl) {
	cmd := k.Command(ctx, "exec", "-it", "app", "-c", "app", "--", "streamer", "tty")
	tty, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: 24, Cols: 80})
	if err != nil {
		t.Fatal(err)
	}
	defer tty.Close()
	out := readAll(tty)
	poll.Until(t, 30*time.Second, "the container's terminal", func() error {
		if !strings.Contains(out.String(), "tty=true") {
			return fmt.Errorf("output %q", out.String())
		}
		return nil
	})
	if err := pty.Setsize(tty, &pty.Winsize{Rows: 40, Cols: 100}); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 30*time.Second, "the container's terminal resized to 40x100", func() error {
		if !strings.Contains(out.String(), "size=40x100") {
			return fmt.Errorf("output %q", out.String())
		}
		return nil
	})
	if _, err := tty.Write([]byte("q\r")); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Errorf("kubectl exec -it = %v, output %q", err, out.String())
	}
}

// testAttach attaches to the container "app", whose process echoes its
// stdin, and sees a line echoed.
func testAttach(t *testing.T, ctx context.Context, k *kube.Kubectl) {
	actx, cancel := context.WithCancel(ctx)
	defer cancel()
	cmd := k.Command(actx, "attach", "-i", "app", "-c", "app")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out := &syncBuffer{}
	cmd.Stdout = out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cancel()
		_ = cmd.Wait()
	}()
	// Lines sent before the stream is up are lost: send until one is
	// echoed.
	line := "ping " + t.Name()
	poll.Until(t, 30*time.Second, "the attached process echoes stdin", func() error {
		if _, err := io.WriteString(stdin, line+"\n"); err != nil {
			return err
		}
		if !strings.Contains(out.String(), "stdin: "+line) {
			return fmt.Errorf("output %q", out.String())
		}
		return nil
	})
}

// forwarding is kubectl port-forward's line for a local port.
var forwarding = regexp.MustCompile(`Forwarding from 127\.0\.0\.1:(\d+) -> 8080`)

// testPortForward forwards a local port to the pod's 8080 and GETs
// through it.
func testPortForward(t *testing.T, ctx context.Context, k *kube.Kubectl) {
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cmd := k.Command(pctx, "port-forward", "pod/app", "--address", "127.0.0.1", ":8080")
	out := &syncBuffer{}
	cmd.Stdout = out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cancel()
		_ = cmd.Wait()
	}()
	var port string
	poll.Until(t, 30*time.Second, "kubectl port-forward listening", func() error {
		m := forwarding.FindStringSubmatch(out.String())
		if m == nil {
			return fmt.Errorf("output %q", out.String())
		}
		port = m[1]
		return nil
	})
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	for _, path := range []string{"/", "/bytes/1000000"} {
		resp, err := client.Get("http://127.0.0.1:" + port + path)
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatalf("GET %s through the tunnel: %v", path, err)
		}
		switch {
		case path == "/" && string(b) != "hello from the pod\n":
			t.Errorf("GET / through the tunnel = %q; want the pod's hello", b)
		case path != "/" && len(b) != 1000000:
			t.Errorf("GET %s through the tunnel = %d bytes; want 1000000", path, len(b))
		}
	}
}

// testKubectlLogs reads the logs of the container "logs" of pod "logs"
// as kubectl logs does: --previous, --tail, --since and -f.
func testKubectlLogs(t *testing.T, ctx context.Context, k *kube.Kubectl) {
	attempt := "early\nlate\ntick 1\ntick 2\ntick 3\ntick 4\n"
	var prev string
	poll.Until(t, 90*time.Second, "a previous attempt", func() error {
		var err error
		prev, err = k.Run(ctx, nil, "logs", "logs", "--previous")
		if err != nil {
			return err
		}
		if prev != attempt {
			return fmt.Errorf("previous log %q", prev)
		}
		return nil
	})
	if out, err := k.Run(ctx, nil, "logs", "logs", "--previous", "--tail=2"); err != nil || out != "tick 3\ntick 4\n" {
		t.Errorf("kubectl logs --previous --tail=2 = %q, %v; want the last two lines", out, err)
	}
	if out, err := k.Run(ctx, nil, "logs", "logs", "--previous", "--since=1h"); err != nil || out != attempt {
		t.Errorf("kubectl logs --previous --since=1h = %q, %v; want every line", out, err)
	}
	// --since with a second count between the times of "early" and
	// "late", 5 s apart: "late" and what follows.
	stamped, err := k.Run(ctx, nil, "logs", "logs", "--previous", "--timestamps")
	if err != nil {
		t.Fatal(err)
	}
	var late time.Time
	for _, l := range strings.Split(stamped, "\n") {
		if ts, line, _ := strings.Cut(l, " "); line == "late" {
			late, err = time.Parse(time.RFC3339Nano, ts)
		}
	}
	if late.IsZero() || err != nil {
		t.Fatalf("kubectl logs --timestamps = %q, %v; want a time on the line late", stamped, err)
	}
	since := time.Since(late).Truncate(time.Second) + 2*time.Second
	if out, err := k.Run(ctx, nil, "logs", "logs", "--previous", "--since="+since.String()); err != nil || out != strings.TrimPrefix(attempt, "early\n") {
		t.Errorf("kubectl logs --previous --since=%s = %q, %v; want from late on", since, out, err)
	}

	// -f while the attempt runs: it waits for the lines to come and ends
	// with the container.
	poll.Until(t, 90*time.Second, "an attempt that printed early only", func() error {
		out, err := k.Run(ctx, nil, "logs", "logs")
		if err != nil {
			return err
		}
		if out != "early\n" {
			return fmt.Errorf("log %q", out)
		}
		return nil
	})
	fctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if out, err := k.Run(fctx, nil, "logs", "-f", "logs"); err != nil || out != attempt {
		t.Errorf("kubectl logs -f = %q, %v; want the whole attempt, then the end", out, err)
	}
}

// testRefused calls the node's kubelet server directly, not through the
// API server: a user without nodes/proxy is forbidden, anonymous is
// unauthorized, and a user with it runs a command; a pod or container
// that does not exist is 404 with the kubelet's message.
func testRefused(t *testing.T, ctx context.Context, n *criNode) {
	server := "https://" + n.addr()
	role := "cairn-test-proxier-" + n.ns
	if _, err := n.c.Client.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: role},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes/proxy"}, Verbs: []string{"create"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = n.c.Client.RbacV1().ClusterRoles().Delete(context.Background(), role, metav1.DeleteOptions{})
	})
	if _, err := n.c.Client.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: role},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "proxier"}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = n.c.Client.RbacV1().ClusterRoleBindings().Delete(context.Background(), role, metav1.DeleteOptions{})
	})

	run := "/run/" + n.ns + "/app/app?cmd=streamer+exit+0"
	for _, tc := range []struct {
		name, user, path, want string
		ok                     bool
	}{
		{"user with nodes/proxy", "proxier", run, "exiting 0\n", true},
		{"user without nodes/proxy", "stranger", run, "Forbidden (user=stranger, verb=create, resource=nodes, subresource=proxy)", false},
		{"non-zero exit", "proxier", "/run/" + n.ns + "/app/app?cmd=streamer+exit+3", "exited with code 3", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := n.c.UserKubectl(t, "", tc.user).Direct(t, server)
			out, err := k.Run(ctx, []byte{}, "create", "--raw", tc.path, "-f", "-")
			if tc.ok && (err != nil || out != tc.want) {
				t.Errorf("kubectl create --raw %s = %q, %v; want %q", tc.path, out, err, tc.want)
			}
			if !tc.ok && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Errorf("kubectl create --raw %s = %q, %v; want an error with %q", tc.path, out, err, tc.want)
			}
		})
	}
	// kubectl asks for a password rather than send no credentials, and
	// shows a generic line for a 404: these go with client-go's transport.
	proxier := n.c.UserConfig("proxier")
	for _, tc := range []struct {
		name string
		cfg  *rest.Config
		path string
		code int
		want string
	}{
		{"anonymous", &rest.Config{}, run, http.StatusUnauthorized, "Unauthorized\n"},
		{"missing pod", proxier, "/run/" + n.ns + "/gone/app?cmd=true", http.StatusNotFound, "pod does not exist\n"},
		{"missing container", proxier, "/run/" + n.ns + "/app/db?cmd=true", http.StatusNotFound, "container not found (\"db\")\n"},
		{"pod of another UID", proxier, "/run/" + n.ns + "/app/0000/app?cmd=true", http.StatusNotFound, "pod does not exist\n"},
		{"missing pod, exec", proxier, "/exec/" + n.ns + "/gone/app?command=true&output=1", http.StatusNotFound, "pod does not exist\n"},
		{"exec without a command", proxier, "/exec/" + n.ns + "/app/app?output=1", http.StatusBadRequest, "no command to run: set command\n"},
		{"exec of nothing to stream", proxier, "/exec/" + n.ns + "/app/app?command=true", http.StatusBadRequest,
			"set at least one of input, output and error to stream\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := &rest.Config{Host: server, TLSClientConfig: rest.TLSClientConfig{Insecure: true,
				CertData: tc.cfg.CertData, KeyData: tc.cfg.KeyData}}
			hc, err := rest.HTTPClientFor(cfg)
			if err != nil {
				t.Fatal(err)
			}
			resp, err := hc.Post(server+tc.path, "", nil)
			if err != nil {
				t.Fatal(err)
			}
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil || resp.StatusCode != tc.code || string(b) != tc.want {
				t.Errorf("POST %s = %d %q, %v; want %d %q", tc.path, resp.StatusCode, b, err, tc.code, tc.want)
			}
		})
	}
}

// testDirectWebSocket execs on the node's kubelet server with client-go's
// WebSocket client, as a client that calls the node directly (not through
// the API server, which speaks SPDY to it) may. containerd's streaming
// server speaks the channel protocols up to v4 over WebSocket, without
// v5's close of stdin: a command without input, then.
func testDirectWebSocket(t *testing.T, ctx context.Context, n *criNode) {
	cfg := rest.CopyConfig(n.c.AdminConfig)
	cfg.Host = "https://" + n.addr()
	cfg.CAData, cfg.CAFile, cfg.Insecure = nil, "", true
	ex, err := remotecommand.NewWebSocketExecutorForProtocols(cfg, "GET",
		cfg.Host+"/exec/"+n.ns+"/app/app?command=streamer&command=exit&command=5&output=1&error=1", "v4.channel.k8s.io")
	if err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	err = ex.StreamWithContext(sctx, remotecommand.StreamOptions{Stdout: &stdout, Stderr: &stderr})
	var exit interface{ ExitStatus() int }
	if !errors.As(err, &exit) || exit.ExitStatus() != 5 || stderr.String() != "exiting 5\n" {
		t.Errorf("exec of streamer exit 5 over WebSocket = %v, stderr %q; want exit code 5 and the command's stderr", err, stderr.String())
	}
}

// testServerStop runs a server of its own beside the node's, streams an
// exec from it with client-go's SPDY client (as the API server does), and
// stops the server mid-stream: the stream ends with it, and the process
// in the container too.
func testServerStop(t *testing.T, ctx context.Context, n *criNode) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := node.NewInformers(n.c.Client, n.name)
	sctx, stop := context.WithCancel(context.Background())
	defer stop()
	lister := f.Core().V1().Pods().Lister()
	f.Start(sctx.Done())
	defer f.Shutdown()
	f.WaitForCacheSync(ctx.Done())
	served := make(chan error, 1)
	go func() {
		served <- Serve(sctx, l, Config{NodeName: n.name, Client: n.c.Client, ClusterCA: n.c.CAPEM, Pods: lister, Runtime: n.cri.Runtime})
	}()

	cfg := rest.CopyConfig(n.c.AdminConfig)
	cfg.Host = "https://" + l.Addr().String()
	cfg.CAData, cfg.CAFile, cfg.Insecure = nil, "", true
	u, err := url.Parse(cfg.Host + "/exec/" + n.ns + "/app/app?command=streamer&command=cat&input=1&output=1")
	if err != nil {
		t.Fatal(err)
	}
	ex, err := remotecommand.NewSPDYExecutor(cfg, "POST", u)
	if err != nil {
		t.Fatal(err)
	}
	stdin, feed := io.Pipe()
	defer feed.Close()
	out := &syncBuffer{}
	streamed := make(chan error, 1)
	go func() {
		streamed <- ex.StreamWithContext(context.Background(), remotecommand.StreamOptions{Stdin: stdin, Stdout: out})
	}()
	go func() { _, _ = io.WriteString(feed, "ping\n") }()
	poll.Until(t, 30*time.Second, "the exec streams", func() error {
		if !strings.Contains(out.String(), "ping") {
			return fmt.Errorf("output %q", out.String())
		}
		return nil
	})
	stop()
	select {
	case <-streamed:
	case <-time.After(30 * time.Second):
		t.Fatal("the stream outlived its server by 30 s")
	}
	if err := <-served; err != nil {
		t.Errorf("Serve() = %v, want nil once its context ended", err)
	}
	poll.Until(t, 60*time.Second, "the stream's goroutines and process gone", func() error {
		if p, pids := proxying(), processes(t, "streamer\x00cat\x00"); p > 0 || len(pids) > 0 {
			return fmt.Errorf("%d goroutines proxying, streamer cat runs as %v; want none", p, pids)
		}
		return nil
	})
}

// testClientGone kills kubectl in the middle of an exec: the server's
// proxy of the stream ends, and the goroutines and file descriptors of
// the process that serves are back to what they were.
func testClientGone(t *testing.T, ctx context.Context, k *kube.Kubectl) {
	// One exec first, so that what the first one sets up for good (the
	// CRI connection, the API server's) is in the count before.
	if _, err := k.Run(ctx, nil, "exec", "app", "-c", "app", "--", "streamer", "exit", "0"); err != nil {
		t.Fatal(err)
	}
	goroutines, fds := runtime.NumGoroutine(), countFDs(t)
	cmd := k.Command(ctx, "exec", "-i", "app", "-c", "app", "--", "streamer", "cat")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out := &syncBuffer{}
	cmd.Stdout = out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 30*time.Second, "the exec streams", func() error {
		if _, err := io.WriteString(stdin, "ping\n"); err != nil {
			return err
		}
		if !strings.Contains(out.String(), "ping") {
			return fmt.Errorf("output %q", out.String())
		}
		return nil
	})
	if n, pids := proxying(), processes(t, "streamer\x00cat\x00"); n == 0 || len(pids) != 1 {
		t.Fatalf("%d goroutines proxy the stream while it is up, and streamer cat runs as %v; want some, and one: the checks below would prove nothing", n, pids)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	poll.Until(t, 60*time.Second, "the stream's goroutines, fds and process gone", func() error {
		g, f, p := runtime.NumGoroutine(), countFDs(t), proxying()
		if p > 0 || g > goroutines || f > fds {
			return fmt.Errorf("%d goroutines proxying; %d goroutines, %d fds; want none, at most %d and %d as before", p, g, f, goroutines, fds)
		}
		// The container's processes are the host's: the runtime's
		// session ended when its stdin closed.
		if pids := processes(t, "streamer\x00cat\x00"); len(pids) > 0 {
			return fmt.Errorf("streamer cat still runs as %v", pids)
		}
		return nil
	})
}

// processes returns the host's processes whose command line is cmdline
// (NUL-separated, as /proc has it).
func processes(t *testing.T, cmdline string) []string {
	t.Helper()
	es, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var pids []string
	for _, e := range es {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && string(b) == cmdline {
			pids = append(pids, e.Name())
		}
	}
	return pids
}

// proxying counts the goroutines in the stream proxies: SPDY's
// upgrade-aware proxy, and the WebSocket translator and tunnel.
func proxying() int {
	buf := make([]byte, 1<<22)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for _, g := range bytes.Split(buf, []byte("\n\n")) {
		for _, h := range []string{"proxy.(*UpgradeAwareHandler)", "proxy.(*StreamTranslatorHandler)", "proxy.(*TunnelingHandler)"} {
			if bytes.Contains(g, []byte(h)) {
				n++
				break
			}
		}
	}
	return n
}

// countFDs counts the process's open file descriptors.
func countFDs(t *testing.T) int {
	t.Helper()
	es, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(es)
}

// syncBuffer is a bytes.Buffer that a command writes while a test reads.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// readAll copies r into a syncBuffer until r ends.
func readAll(r io.Reader) *syncBuffer {
	b := &syncBuffer{}
	go func() { _, _ = io.Copy(b, bufio.NewReader(r)) }()
	return b
}
