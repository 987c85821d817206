// Package handler runs once the action that a container's probe or
// lifecycle hook names — exec (CRI ExecSync), httpGet, tcpSocket, grpc
// (grpc.health.v1 Check) or sleep — against the container:
//
//	err := handler.Run(ctx, rt, handler.FromProbe(p.ProbeHandler), time.Second,
//		handler.Target{Container: c, ContainerID: id, Host: podIP})
//
// nil is success. An httpGet follows redirects as the kubelet does: to
// the same host, at most maxRedirects of them; a redirect to another host
// is not followed and is success, which Target.Warn is told of. Its
// status is success from 200 to 399.
//
// The probes (agent/kubelet/probe) and the hooks
// (agent/kubelet/pods) both run their actions here, so that neither
// depends on the other.
package handler

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Action is what a probe or a hook does; one of its fields is set.
type Action struct {
	Exec      *corev1.ExecAction
	HTTPGet   *corev1.HTTPGetAction
	TCPSocket *corev1.TCPSocketAction
	GRPC      *corev1.GRPCAction
	Sleep     *corev1.SleepAction
}

// FromProbe is the action of a probe.
func FromProbe(h corev1.ProbeHandler) Action {
	return Action{Exec: h.Exec, HTTPGet: h.HTTPGet, TCPSocket: h.TCPSocket, GRPC: h.GRPC}
}

// FromHook is the action of a lifecycle hook. Its tcpSocket, which the
// API keeps only for compatibility, is not run, as with the kubelet.
func FromHook(h *corev1.LifecycleHandler) Action {
	return Action{Exec: h.Exec, HTTPGet: h.HTTPGet, Sleep: h.Sleep}
}

// Target is the container an action runs in or against.
type Target struct {
	Container   *corev1.Container
	ContainerID string // CRI ID, for exec
	// Host is the pod's IP, or the node's for a pod on the host network.
	Host string
	// Warn, if set, is told why an action that succeeded is worth a
	// warning: an httpGet redirected to another host.
	Warn func(msg string)
}

// The kubelet's limits of an httpGet: the redirects it follows, and the
// response body it reads (for the warning of a redirect not followed).
const (
	maxRedirects = 10
	maxBody      = 10 << 10
)

// Run runs a once against t, within timeout if it is positive; nil is
// success. rt runs exec actions.
func Run(ctx context.Context, rt criv1.RuntimeServiceClient, a Action, timeout time.Duration, t Target) error {
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	switch {
	case a.Exec != nil:
		resp, err := rt.ExecSync(ctx, &criv1.ExecSyncRequest{
			ContainerId: t.ContainerID, Cmd: a.Exec.Command, Timeout: int64(timeout / time.Second),
		})
		if err != nil {
			return fmt.Errorf("exec %q: %w", a.Exec.Command, err)
		}
		if resp.ExitCode != 0 {
			return fmt.Errorf("exec %q: exit code %d: %s", a.Exec.Command, resp.ExitCode, trim(resp.Stdout, resp.Stderr))
		}
		return nil
	case a.HTTPGet != nil:
		return doHTTP(ctx, a.HTTPGet, t)
	case a.TCPSocket != nil:
		port, err := resolvePort(a.TCPSocket.Port, t.Container)
		if err != nil {
			return err
		}
		addr := net.JoinHostPort(orDefault(a.TCPSocket.Host, t.Host), strconv.Itoa(port))
		conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		if err != nil {
			return fmt.Errorf("tcp %s: %w", addr, err)
		}
		return conn.Close()
	case a.GRPC != nil:
		return doGRPC(ctx, a.GRPC, t)
	case a.Sleep != nil:
		timer := time.NewTimer(time.Duration(a.Sleep.Seconds) * time.Second)
		defer timer.Stop()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-timer.C:
			return nil
		}
	}
	return errors.New("no handler")
}

func doHTTP(ctx context.Context, g *corev1.HTTPGetAction, t Target) error {
	port, err := resolvePort(g.Port, t.Container)
	if err != nil {
		return err
	}
	scheme := "http"
	if g.Scheme == corev1.URISchemeHTTPS {
		scheme = "https"
	}
	u := &url.URL{Scheme: scheme, Host: net.JoinHostPort(orDefault(g.Host, t.Host), strconv.Itoa(port))}
	if ref, err := url.Parse(g.Path); err == nil {
		u = u.ResolveReference(ref)
	} else {
		u.Path = g.Path
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return err
	}
	req.Header.Set("User-Agent", "cairn-probe")
	for _, h := range g.HTTPHeaders {
		if h.Name == "Host" {
			req.Host = h.Value
			continue
		}
		req.Header.Add(h.Name, h.Value)
	}
	client := &http.Client{
		// Probes check the target, not its certificate.
		Transport:     &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, DisableKeepAlives: true},
		CheckRedirect: checkRedirect,
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("http %s: %w", u, err)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	resp.Body.Close()
	if err != nil {
		return fmt.Errorf("http %s: read the response: %w", u, err)
	}
	switch {
	case resp.StatusCode >= 200 && resp.StatusCode < 300:
		return nil
	case resp.StatusCode >= 300 && resp.StatusCode < 400:
		// A redirect not followed: to another host.
		if t.Warn != nil {
			t.Warn(fmt.Sprintf("Probe terminated redirects, Response body: %s", body))
		}
		return nil
	}
	return fmt.Errorf("http %s: %s: %s", u, resp.Status, trim(body))
}

// checkRedirect follows a redirect to the host of the first request, at
// most maxRedirects of them, and stops at one to another host, whose
// response is then the answer.
func checkRedirect(req *http.Request, via []*http.Request) error {
	if len(via) >= maxRedirects {
		return fmt.Errorf("stopped after %d redirects", maxRedirects)
	}
	if req.URL.Hostname() != via[0].URL.Hostname() {
		return http.ErrUseLastResponse
	}
	return nil
}

func doGRPC(ctx context.Context, g *corev1.GRPCAction, t Target) error {
	addr := net.JoinHostPort(t.Host, strconv.Itoa(int(g.Port)))
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("grpc %s: %w", addr, err)
	}
	defer conn.Close()
	var service string
	if g.Service != nil {
		service = *g.Service
	}
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		return fmt.Errorf("grpc %s health check: %w", addr, err)
	}
	if resp.Status != healthpb.HealthCheckResponse_SERVING {
		return fmt.Errorf("grpc %s: %s", addr, resp.Status)
	}
	return nil
}

// resolvePort is a port number, or the number of the container's port
// of that name.
func resolvePort(p intstr.IntOrString, c *corev1.Container) (int, error) {
	if p.Type == intstr.Int {
		return p.IntValue(), nil
	}
	if c != nil {
		for _, cp := range c.Ports {
			if cp.Name == p.StrVal {
				return int(cp.ContainerPort), nil
			}
		}
	}
	if n, err := strconv.Atoi(p.StrVal); err == nil {
		return n, nil
	}
	return 0, fmt.Errorf("no container port named %q", p.StrVal)
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func trim(out ...[]byte) string {
	var s string
	for _, b := range out {
		s += string(b)
	}
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}
