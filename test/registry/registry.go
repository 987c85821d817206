// Package registry runs a real OCI registry for tests and fills it with
// images built locally from Go programs, so that tests never download an
// image.
//
// Start serves an in-memory registry (go-containerregistry's pkg/registry)
// over plain HTTP on 127.0.0.1; a QEMU guest on user networking reaches it
// at 10.0.2.2:<Port>. BuildAndPush builds a Go main package, such as
// ./test/images/hello, into a reproducible single-layer image and pushes it:
//
//	r := registry.Start(t)
//	digest, err := registry.BuildAndPush(ctx, r, "./test/images/hello", "cairn-test/hello:v1")
//	// the node pulls fmt.Sprintf("10.0.2.2:%d/cairn-test/hello:v1", r.Port())
//
// WithBasicAuth makes it a private registry that serves only requests with
// the given user and password, as a node pulls with imagePullSecrets.
//
// Set CAIRN_REGISTRY_LOG=1 to log every request through t.Logf.
package registry

import (
	"context"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"strconv"
	"testing"
	"time"

	ggcrregistry "github.com/google/go-containerregistry/pkg/registry"
)

// LogEnv names the environment variable that, when true (1, true), makes
// the registry log each request it serves through t.Logf.
const LogEnv = "CAIRN_REGISTRY_LOG"

// Registry is a running registry that keeps its blobs and manifests in memory.
type Registry struct {
	// Addr is where it listens, 127.0.0.1:<port>.
	Addr string
	// Username and Password, if set, are the only credentials it
	// accepts (WithBasicAuth); BuildAndPush pushes with them.
	Username, Password string
}

// Option changes how Start serves.
type Option func(*Registry)

// WithBasicAuth requires HTTP basic authentication as user with password
// on every request; others get 401 with a Basic challenge.
func WithBasicAuth(user, password string) Option {
	return func(r *Registry) { r.Username, r.Password = user, password }
}

// Port returns the TCP port the registry listens on.
func (r *Registry) Port() int {
	_, port, err := net.SplitHostPort(r.Addr)
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(port)
	return n
}

// Start starts an empty registry on a free port of 127.0.0.1, serving plain
// HTTP, and stops it when the test ends. It listens on loopback only: a
// QEMU guest on user networking still reaches it, at 10.0.2.2.
func Start(t testing.TB, opts ...Option) *Registry {
	t.Helper()
	r := &Registry{}
	for _, o := range opts {
		o(r)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("registry: listen on 127.0.0.1: %v", err)
	}
	logger := log.New(io.Discard, "", 0)
	if on, _ := strconv.ParseBool(os.Getenv(LogEnv)); on {
		logger = log.New(tlogWriter{t}, "registry: ", 0)
	}
	handler := ggcrregistry.New(ggcrregistry.Logger(logger))
	if r.Username != "" {
		handler = basicAuth(r.Username, r.Password, handler)
	}
	srv := &http.Server{
		Handler:           handler,
		ErrorLog:          logger,
		ReadHeaderTimeout: 10 * time.Second,
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("registry on %s: %v", l.Addr(), err)
		}
	}()
	t.Cleanup(func() {
		// Let requests in flight finish, so none logs after the test.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			srv.Close()
		}
		<-done
	})
	r.Addr = l.Addr().String()
	logger.Printf("serving on http://%s", r.Addr)
	return r
}

// basicAuth serves next only the requests with user and password.
func basicAuth(user, password string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if u, p, ok := req.BasicAuth(); !ok || u != user || p != password {
			w.Header().Set("WWW-Authenticate", `Basic realm="cairn-test"`)
			http.Error(w, "authentication required", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, req)
	})
}

// tlogWriter sends each line the registry logs to t.Logf.
type tlogWriter struct{ t testing.TB }

func (w tlogWriter) Write(p []byte) (int, error) {
	w.t.Logf("%s", p)
	return len(p), nil
}
