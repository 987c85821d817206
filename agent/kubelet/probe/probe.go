// Package probe runs a Pod's startup, liveness and readiness probes.
//
// Do runs one probe: exec (CRI ExecSync), httpGet, tcpSocket or grpc
// (grpc.health.v1 Check). A Manager runs one goroutine per running
// container and probe kind, each probing every periodSeconds after
// initialDelaySeconds and turning successThreshold successes or
// failureThreshold failures in a row into the probe's result:
//
//   - startup gates the others: until it succeeds they do not run and
//     the container is neither started nor ready; once it succeeds it
//     stops;
//   - readiness is the container's ready;
//   - liveness (and startup) failing stops the container through the CRI,
//     with its grace period, so that the pod worker restarts it as its
//     restartPolicy says, counting the restart.
//
// Results belong to one CRI container: a restarted container starts
// again unready and not started.
package probe

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
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

// Kind is a probe's kind.
type Kind string

const (
	Startup   Kind = "startup"
	Liveness  Kind = "liveness"
	Readiness Kind = "readiness"
)

// The API's defaults of a probe's timing.
const (
	DefaultPeriod           = 10 * time.Second
	DefaultTimeout          = 1 * time.Second
	DefaultSuccessThreshold = 1
	DefaultFailureThreshold = 3
)

// Target is what a probe of a container reaches.
type Target struct {
	Container   *corev1.Container
	ContainerID string // CRI ID, for exec
	// Host is the pod's IP, or the node's for a pod on the host network.
	Host string
}

// Do runs probe p once against t within its timeout; nil is success.
func Do(ctx context.Context, rt criv1.RuntimeServiceClient, p *corev1.Probe, t Target) error {
	return Run(ctx, rt, p.ProbeHandler, seconds(p.TimeoutSeconds, DefaultTimeout), t)
}

// Run runs handler h once against t, within timeout if it is positive:
// a probe's handler or, the same actions, a lifecycle hook's. Nil is
// success.
func Run(ctx context.Context, rt criv1.RuntimeServiceClient, h corev1.ProbeHandler, timeout time.Duration, t Target) error {
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	switch {
	case h.Exec != nil:
		resp, err := rt.ExecSync(ctx, &criv1.ExecSyncRequest{
			ContainerId: t.ContainerID, Cmd: h.Exec.Command, Timeout: int64(timeout / time.Second),
		})
		if err != nil {
			return fmt.Errorf("exec %q: %w", h.Exec.Command, err)
		}
		if resp.ExitCode != 0 {
			return fmt.Errorf("exec %q: exit code %d: %s", h.Exec.Command, resp.ExitCode, trim(resp.Stdout, resp.Stderr))
		}
		return nil
	case h.HTTPGet != nil:
		return doHTTP(ctx, h.HTTPGet, t)
	case h.TCPSocket != nil:
		port, err := resolvePort(h.TCPSocket.Port, t.Container)
		if err != nil {
			return err
		}
		addr := net.JoinHostPort(orDefault(h.TCPSocket.Host, t.Host), strconv.Itoa(port))
		conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		if err != nil {
			return fmt.Errorf("tcp %s: %w", addr, err)
		}
		return conn.Close()
	case h.GRPC != nil:
		addr := net.JoinHostPort(t.Host, strconv.Itoa(int(h.GRPC.Port)))
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return fmt.Errorf("grpc %s: %w", addr, err)
		}
		defer conn.Close()
		var service string
		if h.GRPC.Service != nil {
			service = *h.GRPC.Service
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
		Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, DisableKeepAlives: true},
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("http %s: %w", u, err)
	}
	resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode >= 400 {
		return fmt.Errorf("http %s: %s", u, resp.Status)
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

func seconds(s int32, def time.Duration) time.Duration {
	if s <= 0 {
		return def
	}
	return time.Duration(s) * time.Second
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
