// Package server is the node's kubelet server: the HTTPS endpoint on the
// kubelet's port (10250) that the API server calls for what only the node
// can answer, with the kubelet's paths and query parameters so that the
// API server's proxy and kubectl work unchanged. It serves /healthz, /pods,
// /containerLogs/{namespace}/{pod}/{container} (kubectl logs), and /exec,
// /attach, /portForward and /run, which go through the CRI: the runtime's
// streaming server answers the upgraded connection (SPDY or WebSocket)
// and the server proxies it, as the kubelet does.
//
// Callers authenticate with a client certificate of the cluster CA (the
// API server's kubelet client certificate) or a bearer token that the API
// server's TokenReview accepts, and are authorized by a
// SubjectAccessReview on the Node's subresources, as the kubelet does.
// Until the node has a serving certificate from the cluster, it serves
// with a self-signed one.
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
	"time"

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
	// Hosts are the IP addresses and names the serving certificate is
	// for: the node's addresses and hostname.
	Hosts []string
	// Log receives errors; nil means slog.Default().
	Log *slog.Logger
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
	cert, err := selfSigned(cfg.NodeName, cfg.Hosts, time.Now())
	if err != nil {
		l.Close()
		return err
	}
	s := &server{cfg: cfg, auth: newAuth(cfg.Client, cfg.NodeName)}
	hs := &http.Server{
		Handler: s.routes(),
		TLSConfig: &tls.Config{
			Certificates: []tls.Certificate{cert},
			ClientCAs:    cas,
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
	cfg  Config
	auth *auth
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
