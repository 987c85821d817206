package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	"github.com/cairn-os/cairn/api/client"
	"github.com/cairn-os/cairn/machineconfig"
)

// callTimeout bounds a verb that is one call; a stream (logs -f) runs
// until the user ends it.
const callTimeout = 30 * time.Second

// target is one node a verb runs on: its connection, and where the verb
// writes.
type target struct {
	Endpoint string
	Config   *machineconfig.ClientConfig
	Client   *client.Client
	// Out is the command's output, each line prefixed with the node when
	// the verb runs on several.
	Out io.Writer
}

// endpoints are the nodes a verb runs on: --nodes, each once (a reboot
// named twice is one), else the client config's first endpoint.
func (f *nodeFlags) endpoints(cc *machineconfig.ClientConfig) ([]string, error) {
	var out []string
	for _, n := range f.nodes {
		if n = strings.TrimSpace(n); n != "" && !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	if len(out) > 0 {
		return out, nil
	}
	if len(cc.Endpoints) == 0 {
		return nil, fmt.Errorf("%s lists no endpoints: pass --nodes HOST:PORT[,HOST:PORT…]", f.cairnconfig)
	}
	return cc.Endpoints[:1], nil
}

// onNodes runs fn on every node at once, each with its own connection and
// a context bounded by timeout (0: none). On one node its output and error
// are fn's as they are; on several each line of output is prefixed with
// its node, and the error names every node that failed and why.
func (f *nodeFlags) onNodes(cmd *cobra.Command, timeout time.Duration, fn func(context.Context, *target) error) error {
	return f.inWaves(cmd, 0, timeout, fn)
}

// inWaves is onNodes wave by wave: wave nodes at once (0: all), the next
// wave only once every node of this one succeeded.
func (f *nodeFlags) inWaves(cmd *cobra.Command, wave int, timeout time.Duration, fn func(context.Context, *target) error) error {
	cc, err := machineconfig.LoadClientConfig(f.cairnconfig)
	if err != nil {
		return fmt.Errorf("%w (make one with `cairn config gen`, or point --cairnconfig at it)", err)
	}
	endpoints, err := f.endpoints(cc)
	if err != nil {
		return err
	}
	if len(endpoints) == 1 {
		return f.onNode(cmd.Context(), cc, endpoints[0], cmd.OutOrStdout(), timeout, fn)
	}
	if wave <= 0 {
		wave = len(endpoints)
	}
	width := 0
	for _, e := range endpoints {
		width = max(width, len(e))
	}
	out := &lockedWriter{w: cmd.OutOrStdout()}
	errOut := &lockedWriter{w: cmd.ErrOrStderr()}
	errs := make([]error, len(endpoints))
	var failed []string
	for start := 0; start < len(endpoints) && len(failed) == 0; start += wave {
		var wg sync.WaitGroup
		for i := start; i < min(start+wave, len(endpoints)); i++ {
			e := endpoints[i]
			prefix := fmt.Sprintf("%-*s ", width+1, e+":")
			w := &linePrefixer{out: out, prefix: prefix}
			wg.Go(func() {
				errs[i] = f.onNode(cmd.Context(), cc, e, w, timeout, fn)
				if err := w.Flush(); err != nil && errs[i] == nil {
					errs[i] = err
				}
				if errs[i] != nil {
					// Now, not only in the summary: a stream (logs -f) of
					// the others may go on until the user ends it.
					fmt.Fprintf(errOut, "%serror: %v\n", prefix, errs[i])
				}
			})
		}
		wg.Wait()
		for i := start; i < min(start+wave, len(endpoints)); i++ {
			if errs[i] != nil {
				failed = append(failed, fmt.Sprintf("\n  %-*s %v", width+1, endpoints[i]+":", errs[i]))
			}
		}
		if rest := endpoints[min(start+wave, len(endpoints)):]; len(failed) > 0 && len(rest) > 0 {
			failed = append(failed, fmt.Sprintf("\n  stopped: not tried on %s", strings.Join(rest, ", ")))
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("%d of %d nodes failed:%s", countFailed(errs), len(endpoints), strings.Join(failed, ""))
	}
	return nil
}

func countFailed(errs []error) int {
	n := 0
	for _, err := range errs {
		if err != nil {
			n++
		}
	}
	return n
}

// onNode connects to one node and runs fn on it. A node that does not
// answer fails once the connect timeout passes, whatever the call.
func (f *nodeFlags) onNode(ctx context.Context, cc *machineconfig.ClientConfig, endpoint string, w io.Writer, timeout time.Duration, fn func(context.Context, *target) error) error {
	c, err := client.Dial(cc, endpoint, grpc.WithConnectParams(grpc.ConnectParams{
		Backoff:           backoff.DefaultConfig,
		MinConnectTimeout: f.connectTimeout,
	}))
	if err != nil {
		return err
	}
	defer c.Close()
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	return fn(ctx, &target{Endpoint: endpoint, Config: cc, Client: c, Out: w})
}

// lockedWriter serialises the writes of several nodes' output.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// linePrefixer writes whole lines, each after prefix, so that the
// output of nodes running at once interleaves by line.
type linePrefixer struct {
	out    io.Writer
	prefix string
	buf    []byte // the line begun but not ended yet
}

func (l *linePrefixer) Write(p []byte) (int, error) {
	l.buf = append(l.buf, p...)
	for {
		i := bytes.IndexByte(l.buf, '\n')
		if i < 0 {
			break
		}
		if _, err := l.out.Write(append([]byte(l.prefix), l.buf[:i+1]...)); err != nil {
			return 0, err
		}
		l.buf = l.buf[i+1:]
	}
	l.buf = bytes.Clone(l.buf) // let the written lines go
	return len(p), nil
}

// Flush writes a last line that did not end, ending it.
func (l *linePrefixer) Flush() error {
	if len(l.buf) == 0 {
		return nil
	}
	_, err := l.Write([]byte{'\n'})
	return err
}
