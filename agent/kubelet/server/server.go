// Package server is the node's kubelet server: the HTTPS endpoint on the
// kubelet's port (10250) that the API server calls for what only the node
// can answer, with the kubelet's paths and query parameters so that the
// API server's proxy and kubectl work unchanged. It serves /healthz, /pods,
// /containerLogs/{namespace}/{pod}/{container} (kubectl logs),
// /stats/summary and /metrics/resource (what metrics-server reads for
// kubectl top), /metrics, /metrics/probes (the kubelet's
// prober_probe_total), /configz, and /exec, /attach, /portForward and
// /run, which go through the CRI: the runtime's streaming server answers
// the upgraded connection (SPDY or WebSocket) and the server proxies it,
// as the kubelet does.
//
// Callers authenticate with a client certificate of the cluster CA (the
// API server's kubelet client certificate) or a bearer token that the API
// server's TokenReview accepts, and are authorized by a
// SubjectAccessReview on the Node's subresources, as the kubelet does.
// Its serving certificate is the one the cluster issues to the node
// through a CertificateSigningRequest (signer kubernetes.io/kubelet-serving),
// renewed before it expires; until one is issued, a self-signed one.
//
//	l, _ := net.Listen("tcp", ":10250")
//	err := server.Serve(ctx, l, server.Config{NodeName: m.Name, Client: m.Client, ...})
package server

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Config is what Serve needs.
type Config struct {
	// NodeName is the Node's name, the object of the access reviews.
	NodeName string
	// Client makes the TokenReviews and SubjectAccessReviews.
	Client kubernetes.Interface
	// ClusterCA is the PEM cluster CA whose client certificates
	// authenticate.
	ClusterCA []byte
	// Pods lists the node's pods.
	Pods corelisters.PodLister
	// Runtime is the CRI that exec, attach, port-forward and run go
	// through.
	Runtime criv1.RuntimeServiceClient
	// PodLogRoot holds the containers' CRI logs (internal/crilog's layout).
	PodLogRoot string
	// Hosts are the IP addresses and names the self-signed serving
	// certificate is for when there is no Node.
	Hosts []string
	// Stats reads the usage of /stats/summary and /metrics/resource; nil
	// leaves those paths out.
	Stats StatsProvider
	// Node, if set, is the Node whose addresses (status.addresses) the
	// serving certificate is for. The certificate is then requested from
	// the cluster (signer kubernetes.io/kubelet-serving), stored in
	// CertFile, and renewed before it expires and when the addresses
	// change; until the cluster issues one, a self-signed one serves.
	Node     NodeSource
	CertFile string
	// Metrics, if set, is served at /metrics: the agent's registry.
	Metrics prometheus.Gatherer
	// ProbeMetrics, if set, is served at /metrics/probes: the probes'
	// runs as the kubelet counts them (prober_probe_total).
	ProbeMetrics prometheus.Gatherer
	// Configz is served at /configz.
	Configz KubeletConfig
	// Log receives errors; nil means slog.Default().
	Log *slog.Logger

	// now is the serving certificate's clock and certCheck how often it
	// is looked at, for a test: nil means time.Now, 0 at the deadline.
	now       func() time.Time
	certCheck time.Duration
}

// logPoll is how often a followed log is read again at its end.
const logPoll = 250 * time.Millisecond

// shutdownGrace is how long requests in flight get once ctx ends; a
// followed log ends with ctx at once.
const shutdownGrace = 5 * time.Second

// Serve serves on l until ctx ends, then closes l and returns nil; it
// returns an error if it cannot serve.
func Serve(ctx context.Context, l net.Listener, cfg Config) error {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	cas := x509.NewCertPool()
	if !cas.AppendCertsFromPEM(cfg.ClusterCA) {
		l.Close()
		return errors.New("kubelet server: no cluster CA certificate to authenticate clients with")
	}
	if cfg.now == nil {
		cfg.now = time.Now
	}
	hosts := cfg.Hosts
	if cfg.Node != nil {
		hosts = addresses(cfg.Node.Node())
	}
	self, err := selfSigned(cfg.NodeName, hosts, cfg.now())
	if err != nil {
		l.Close()
		return err
	}
	cert := &servingCert{nodeName: cfg.NodeName, node: cfg.Node, csrs: cfg.Client.CertificatesV1().CertificateSigningRequests(),
		file: cfg.CertFile, now: cfg.now, check: cfg.certCheck, log: cfg.Log, self: &self}
	var wg sync.WaitGroup
	defer wg.Wait()
	if cfg.Node != nil {
		if cfg.CertFile == "" {
			l.Close()
			return errors.New("kubelet server: no file to store the serving certificate in")
		}
		changed, stop, err := cfg.Node.NodeChanged()
		if err != nil {
			l.Close()
			return fmt.Errorf("kubelet server: %w", err)
		}
		defer stop()
		rctx, cancel := context.WithCancel(ctx)
		defer cancel() // before the Wait: the listener may fail first
		cert.load()
		wg.Go(func() { cert.run(rctx, changed) })
	}
	s := &server{cfg: cfg, auth: newAuth(cfg.Client, cfg.NodeName), targets: newTargets(cfg.Runtime)}
	hs := &http.Server{
		Handler: s.routes(),
		TLSConfig: &tls.Config{
			GetCertificate: cert.get,
			ClientCAs:      cas,
			// Without a certificate, a bearer token may authenticate.
			ClientAuth: tls.VerifyClientCertIfGiven,
			MinVersion: tls.VersionTLS12,
		},
		ReadHeaderTimeout: 10 * time.Second,
		BaseContext:       func(net.Listener) context.Context { return ctx },
		ErrorLog:          slog.NewLogLogger(cfg.Log.Handler(), slog.LevelDebug),
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
		defer cancel()
		if err := hs.Shutdown(sctx); err != nil {
			hs.Close()
		}
	}()
	cfg.Log.Info("kubelet server listening", "addr", l.Addr().String())
	err = hs.ServeTLS(l, "", "")
	<-done
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return fmt.Errorf("kubelet server: %w", err)
}

// server holds what the handlers share.
type server struct {
	cfg     Config
	auth    *auth
	targets *targets
}

// routes are the kubelet's paths, each behind authentication and
// authorization.
func (s *server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprint(w, "ok")
	})
	mux.HandleFunc("GET /pods", s.pods)
	mux.HandleFunc("GET /containerLogs/{namespace}/{pod}/{container}", s.containerLogs)
	if s.cfg.Stats != nil {
		mux.HandleFunc("GET /stats/summary", s.statsSummary)
		mux.HandleFunc("GET /metrics/resource", s.resourceMetrics)
	}
	mux.HandleFunc("GET /configz", s.configz)
	s.metricsRoutes(mux)
	// The streams take GET (WebSocket) and POST (SPDY), with or without
	// the pod's UID, as the kubelet's do.
	for _, p := range []string{"/exec/{namespace}/{pod}/{container}", "/exec/{namespace}/{pod}/{uid}/{container}"} {
		mux.HandleFunc("GET "+p, s.exec)
		mux.HandleFunc("POST "+p, s.exec)
	}
	for _, p := range []string{"/attach/{namespace}/{pod}/{container}", "/attach/{namespace}/{pod}/{uid}/{container}"} {
		mux.HandleFunc("GET "+p, s.attach)
		mux.HandleFunc("POST "+p, s.attach)
	}
	for _, p := range []string{"/portForward/{namespace}/{pod}", "/portForward/{namespace}/{pod}/{uid}"} {
		mux.HandleFunc("GET "+p, s.portForward)
		mux.HandleFunc("POST "+p, s.portForward)
	}
	mux.HandleFunc("POST /run/{namespace}/{pod}/{container}", s.run)
	mux.HandleFunc("POST /run/{namespace}/{pod}/{uid}/{container}", s.run)
	return s.auth.wrap(mux, s.cfg.Log)
}
