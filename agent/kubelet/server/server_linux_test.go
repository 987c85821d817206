package server

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/cairn-os/cairn/agent/node"
	"github.com/cairn-os/cairn/internal/crilog"
	"github.com/cairn-os/cairn/test/kube"
)

// The API server reaches nodes at their InternalIP, 127.0.0.1 here,
// rather than at their hostname.
func TestMain(m *testing.M) {
	os.Exit(kube.Main(m, kube.Options{APIServerFlags: []string{"--kubelet-preferred-address-types=InternalIP"}}))
}

// env is a Node served by a kubelet server on loopback, with one pod whose
// container "app" restarted once: logs of attempts 0 and 1.
type env struct {
	c          *kube.Cluster
	ns, node   string
	pod        *corev1.Pod
	addr       string // the server's host:port
	logDir     string // the container's logs
	t0         time.Time
	prev, curr []string // the lines of attempts 0 and 1
}

func newEnv(t *testing.T) *env {
	t.Helper()
	c := kube.Shared(t)
	ns := c.Namespace()
	e := &env{c: c, ns: ns, node: "node-" + ns, t0: time.Date(2026, 1, 2, 15, 0, 0, 0, time.UTC)}
	ctx := t.Context()
	nodeClient, err := kubernetes.NewForConfig(c.UserConfig("system:node:"+e.node, "system:nodes"))
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e.addr = l.Addr().String()
	port := l.Addr().(*net.TCPAddr).Port

	n, err := nodeClient.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: e.node}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Client.CoreV1().Nodes().Delete(context.Background(), e.node, metav1.DeleteOptions{}) })
	// A patch, as agent/node's: the controller manager changes the Node
	// meanwhile.
	status, err := json.Marshal(map[string]any{"status": corev1.NodeStatus{
		Addresses:       []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "127.0.0.1"}, {Type: corev1.NodeHostName, Address: e.node}},
		DaemonEndpoints: corev1.NodeDaemonEndpoints{KubeletEndpoint: corev1.DaemonEndpoint{Port: int32(port)}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := nodeClient.CoreV1().Nodes().Patch(ctx, n.Name, types.MergePatchType, status, metav1.PatchOptions{}, "status"); err != nil {
		t.Fatal(err)
	}
	pod, err := c.Client.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec:       corev1.PodSpec{NodeName: e.node, Containers: []corev1.Container{{Name: "app", Image: "example.com/app:v1"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod.Status.Phase = corev1.PodRunning
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{
		Name: "app", Image: "example.com/app:v1", RestartCount: 1,
		State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}},
	}}
	if e.pod, err = nodeClient.CoreV1().Pods(ns).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	// The logs as containerd's CRI writes them.
	root := t.TempDir()
	e.logDir = filepath.Join(crilog.PodDir(root, ns, "web", string(pod.UID)), "app")
	e.prev = []string{"attempt 0 starts", "attempt 0 crashes"}
	e.curr = []string{"attempt 1 starts", "line 2", "line 3", "line 4"}
	e.writeLog(t, 0, e.prev, 0)
	e.writeLog(t, 1, e.curr, 10)

	f := node.NewInformers(nodeClient, e.node)
	pods := f.Core().V1().Pods()
	lister := pods.Lister()
	sctx, cancel := context.WithCancel(context.Background())
	f.Start(sctx.Done())
	f.WaitForCacheSync(ctx.Done())
	done := make(chan error, 1)
	go func() {
		done <- Serve(sctx, l, Config{NodeName: e.node, Client: nodeClient, ClusterCA: c.CAPEM, Pods: lister,
			PodLogRoot: root, Hosts: []string{"127.0.0.1"}})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve() = %v, want nil once its context ended", err)
		}
		f.Shutdown()
	})
	return e
}

// writeLog appends lines to the log of attempt, the first written
// seconds after t0, one a second.
func (e *env) writeLog(t *testing.T, attempt uint32, lines []string, seconds int) {
	t.Helper()
	path := filepath.Join(filepath.Dir(e.logDir), crilog.ContainerLog("app", attempt))
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for i, l := range lines {
		ts := e.t0.Add(time.Duration(seconds+i) * time.Second).Format(time.RFC3339Nano)
		if _, err := f.WriteString(ts + " stdout F " + l + "\n"); err != nil {
			t.Fatal(err)
		}
	}
}

// logs reads the pod's log through the API server, as kubectl logs does.
func (e *env) logs(t *testing.T, o corev1.PodLogOptions) (string, error) {
	t.Helper()
	b, err := e.c.Client.CoreV1().Pods(e.ns).GetLogs("web", &o).DoRaw(t.Context())
	return string(b), err
}

func lines(ls ...string) string { return strings.Join(ls, "\n") + "\n" }

func TestLogsThroughAPIServer(t *testing.T) {
	e := newEnv(t)
	since := metav1.NewTime(e.t0.Add(12 * time.Second))
	for _, tt := range []struct {
		name string
		o    corev1.PodLogOptions
		want string
	}{
		{"all", corev1.PodLogOptions{}, lines(e.curr...)},
		{"tail", corev1.PodLogOptions{TailLines: ptr[int64](2)}, lines(e.curr[2:]...)},
		{"no tail", corev1.PodLogOptions{TailLines: ptr[int64](0)}, ""},
		{"timestamps", corev1.PodLogOptions{TailLines: ptr[int64](1), Timestamps: true},
			lines("2026-01-02T15:00:13Z line 4")},
		{"previous", corev1.PodLogOptions{Previous: true}, lines(e.prev...)},
		{"since time", corev1.PodLogOptions{SinceTime: &since}, lines(e.curr[2:]...)},
		{"limit bytes", corev1.PodLogOptions{LimitBytes: ptr[int64](20)}, "attempt 1 starts\nlin"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := e.logs(t, tt.o)
			if err != nil {
				t.Fatalf("logs(%+v) = %v", tt.o, err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("logs(%+v) mismatch (-want +got):\n%s", tt.o, diff)
			}
		})
	}
	// Lines written more than a minute ago are before sinceSeconds=60.
	if got, err := e.logs(t, corev1.PodLogOptions{SinceSeconds: ptr[int64](60)}); err != nil || got != "" {
		t.Errorf("logs(sinceSeconds=60) = %q, %v; want no line", got, err)
	}
	// The API server checks the container's name itself; TestAuth asks
	// the server for a container that does not exist.
	_, err := e.c.Client.CoreV1().Pods(e.ns).GetLogs("gone", &corev1.PodLogOptions{}).DoRaw(t.Context())
	if !apierrors.IsNotFound(err) {
		t.Errorf("logs of a pod that does not exist = %v; want 404", err)
	}
}

// TestLogsFollow follows the log through the API server, sees a line
// written meanwhile, and goes away: the server closes the log file. A
// second follow ends when the container's next attempt starts.
func TestLogsFollow(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	rc, err := e.c.Client.CoreV1().Pods(e.ns).GetLogs("web", &corev1.PodLogOptions{Follow: true, TailLines: ptr[int64](1)}).Stream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	r := bufio.NewReader(rc)
	read := func() string {
		l, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("read the followed log: %v", err)
		}
		return l
	}
	if got := read(); got != "line 4\n" {
		t.Fatalf("followed log starts with %q, want the last line", got)
	}
	path := filepath.Join(e.logDir, "1.log")
	if !fileOpen(t, path) {
		t.Fatalf("%s is not open while followed", path)
	}
	e.writeLog(t, 1, []string{"line 5"}, 20)
	if got := read(); got != "line 5\n" {
		t.Fatalf("followed log goes on with %q, want line 5", got)
	}
	cancel()
	deadline := time.Now().Add(10 * time.Second)
	for fileOpen(t, path) {
		if time.Now().After(deadline) {
			t.Fatalf("%s still open 10 s after the client went away", path)
		}
		time.Sleep(50 * time.Millisecond)
	}

	// Once the container restarted, its old attempt's log ends.
	rc2, err := e.c.Client.CoreV1().Pods(e.ns).GetLogs("web", &corev1.PodLogOptions{Follow: true}).Stream(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer rc2.Close()
	r = bufio.NewReader(rc2)
	for range 5 {
		read()
	}
	e.writeLog(t, 2, []string{"attempt 2 starts"}, 30)
	ended := make(chan error, 1)
	go func() {
		_, err := io.ReadAll(r)
		ended <- err
	}()
	select {
	case err := <-ended:
		if err != nil {
			t.Errorf("the followed log of attempt 1 ended with %v, want its end", err)
		}
	case <-time.After(10 * time.Second):
		t.Error("the followed log of attempt 1 did not end within 10 s of attempt 2's start")
	}
}

// fileOpen reports whether this process has path open.
func fileOpen(t *testing.T, path string) bool {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	for _, fd := range fds {
		if target, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name())); err == nil && target == path {
			return true
		}
	}
	return false
}

// TestAuth calls the server directly: without credentials, with a token
// the API server refuses, as users with and without nodes/proxy or
// nodes/pods, and with a ServiceAccount's token.
func TestAuth(t *testing.T) {
	e := newEnv(t)
	ctx := t.Context()
	// proxier may get nodes/proxy, podlister only nodes/pods.
	for user, sub := range map[string]string{"proxier": "nodes/proxy", "podlister": "nodes/pods"} {
		role := e.ns + "-" + user
		_, err := e.c.Client.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
			ObjectMeta: metav1.ObjectMeta{Name: role},
			Rules:      []rbacv1.PolicyRule{{Verbs: []string{"get"}, APIGroups: []string{""}, Resources: []string{sub}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		_, err = e.c.Client.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: role},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = e.c.Client.RbacV1().ClusterRoleBindings().Delete(context.Background(), role, metav1.DeleteOptions{})
			_ = e.c.Client.RbacV1().ClusterRoles().Delete(context.Background(), role, metav1.DeleteOptions{})
		})
	}
	if _, err := e.c.Client.CoreV1().ServiceAccounts(e.ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "reader"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tr, err := e.c.Client.CoreV1().ServiceAccounts(e.ns).CreateToken(ctx, "reader", &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	for _, tt := range []struct {
		name     string
		cfg      *rest.Config // its client certificate or token
		path     string
		wantCode int
		wantBody string
	}{
		{"anonymous", &rest.Config{}, "/healthz", http.StatusUnauthorized, "Unauthorized"},
		{"refused token", &rest.Config{BearerToken: "not-a-token"}, "/pods", http.StatusUnauthorized, "Unauthorized"},
		{"user without nodes/proxy", e.c.UserConfig("stranger"), "/pods", http.StatusForbidden,
			"Forbidden (user=stranger, verb=get, resource=nodes, subresource=proxy)"},
		{"user without nodes/proxy, logs", e.c.UserConfig("stranger"), "/containerLogs/" + e.ns + "/web/app", http.StatusForbidden,
			"Forbidden (user=stranger, verb=get, resource=nodes, subresource=proxy)"},
		{"service account without nodes/proxy", &rest.Config{BearerToken: tr.Status.Token}, "/healthz", http.StatusForbidden,
			"Forbidden (user=system:serviceaccount:" + e.ns + ":reader, verb=get, resource=nodes, subresource=proxy)"},
		{"user with nodes/proxy", e.c.UserConfig("proxier"), "/healthz", http.StatusOK, "ok"},
		{"user with nodes/pods", e.c.UserConfig("podlister"), "/pods", http.StatusOK, `"kind":"PodList"`},
		{"user with nodes/pods, logs", e.c.UserConfig("podlister"), "/containerLogs/" + e.ns + "/web/app", http.StatusForbidden,
			"Forbidden (user=podlister, verb=get, resource=nodes, subresource=proxy)"},
		{"user with nodes/proxy, logs", e.c.UserConfig("proxier"), "/containerLogs/" + e.ns + "/web/app?tailLines=1", http.StatusOK, "line 4\n"},
		{"user with nodes/proxy, missing container", e.c.UserConfig("proxier"), "/containerLogs/" + e.ns + "/web/db", http.StatusNotFound,
			`container "db" not found in pod "` + e.ns + `/web"`},
		{"user with nodes/proxy, bad tail", e.c.UserConfig("proxier"), "/containerLogs/" + e.ns + "/web/app?tailLines=-1", http.StatusBadRequest,
			`tailLines="-1" is not a number of at least 0`},
		{"user with nodes/proxy, missing pod", e.c.UserConfig("proxier"), "/containerLogs/" + e.ns + "/gone/app", http.StatusNotFound,
			`pod "` + e.ns + `/gone" does not exist`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			code, body := e.get(t, tt.cfg, tt.path)
			if code != tt.wantCode || !strings.Contains(body, tt.wantBody) {
				t.Errorf("GET %s = %d %q, want %d with %q", tt.path, code, body, tt.wantCode, tt.wantBody)
			}
		})
	}

	code, body := e.get(t, e.c.UserConfig("proxier"), "/pods")
	var list corev1.PodList
	if err := json.Unmarshal([]byte(body), &list); code != http.StatusOK || err != nil {
		t.Fatalf("GET /pods = %d %q, %v; want a PodList", code, body, err)
	}
	if len(list.Items) != 1 || list.Items[0].UID != e.pod.UID || list.Kind != "PodList" {
		t.Errorf("GET /pods = %s %d pods, want the PodList of pod %s", list.Kind, len(list.Items), e.pod.UID)
	}
}

// get calls the server with cfg's client certificate or token; the server's
// certificate is its own, so it is not verified.
func (e *env) get(t *testing.T, cfg *rest.Config, path string) (int, string) {
	t.Helper()
	tc := &tls.Config{InsecureSkipVerify: true}
	if cfg.CertData != nil {
		cert, err := tls.X509KeyPair(cfg.CertData, cfg.KeyData)
		if err != nil {
			t.Fatal(err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: tc}, Timeout: 20 * time.Second}
	defer client.CloseIdleConnections()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, "https://"+e.addr+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.BearerToken != "" {
		req.Header.Set("Authorization", "Bearer "+cfg.BearerToken)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

func ptr[T any](v T) *T { return &v }
