package supervisor

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
)

// Probe tells whether a running service is ready. The supervisor calls
// Check until it returns nil, each time with a deadline in ctx; a check that
// runs a process starts it through s, so under PID 1 the Reaper stays the
// only place that reaps.
type Probe interface {
	Check(ctx context.Context, s Starter) error
}

// ProbeFunc is a Probe that needs no process.
type ProbeFunc func(ctx context.Context) error

// Check implements Probe.
func (f ProbeFunc) Check(ctx context.Context, _ Starter) error { return f(ctx) }

// UnixSocketProbe is ready once a connection to the unix socket at path is
// accepted.
func UnixSocketProbe(path string) Probe { return dialProbe("unix", path) }

// TCPProbe is ready once a TCP connection to addr (host:port) is accepted.
func TCPProbe(addr string) Probe { return dialProbe("tcp", addr) }

func dialProbe(network, addr string) Probe {
	return ProbeFunc(func(ctx context.Context) error {
		var d net.Dialer
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return err
		}
		return c.Close()
	})
}

// HTTPProbe is ready once a GET of url answers with a 2xx or 3xx status.
// Redirects are not followed.
func HTTPProbe(url string) Probe {
	client := &http.Client{
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	return ProbeFunc(func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode < 200 || resp.StatusCode >= 400 {
			return fmt.Errorf("GET %s: %s", url, resp.Status)
		}
		return nil
	})
}

// FileProbe is ready once path exists.
func FileProbe(path string) Probe {
	return ProbeFunc(func(context.Context) error {
		_, err := os.Stat(path)
		return err
	})
}

// ExecProbe is ready once the command path args... exits with status 0. A
// command still running at the deadline is killed.
func ExecProbe(path string, args ...string) Probe { return execProbe{path, args} }

type execProbe struct {
	path string
	args []string
}

func (p execProbe) Check(ctx context.Context, s Starter) error {
	cmd := exec.Command(p.path, p.args...)
	exits, err := s.Start(cmd)
	if err != nil {
		return err
	}
	select {
	case e := <-exits:
		if e.Failed() {
			return fmt.Errorf("%s: %s", p.path, e)
		}
		return nil
	case <-ctx.Done():
		cmd.Process.Kill()
		<-exits
		return fmt.Errorf("%s: %w", p.path, ctx.Err())
	}
}
