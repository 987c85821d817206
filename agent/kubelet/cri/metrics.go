package cri

import (
	"context"
	"path"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
)

// Option configures a Client.
type Option func(*options) error

type options struct {
	interceptors []grpc.UnaryClientInterceptor
}

// WithMetrics measures every CRI call into reg: its latency by method and
// gRPC code, and, with buckets fit for them, the image pulls.
func WithMetrics(reg prometheus.Registerer) Option {
	return func(o *options) error {
		const ns, sub = "cairn", "cri"
		calls := prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: sub, Name: "request_duration_seconds",
			Help:    "Latency of CRI calls to the container runtime, by method and gRPC code.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}, []string{"method", "code"})
		pulls := prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: sub, Name: "image_pull_duration_seconds",
			Help:    "Latency of image pulls through the CRI, by gRPC code.",
			Buckets: []float64{0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600},
		}, []string{"code"})
		for _, c := range []prometheus.Collector{calls, pulls} {
			if err := reg.Register(c); err != nil {
				return err
			}
		}
		o.interceptors = append(o.interceptors, func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			start := time.Now()
			err := invoker(ctx, method, req, reply, cc, opts...)
			took := time.Since(start).Seconds()
			name, code := path.Base(method), status.Code(err).String()
			calls.WithLabelValues(name, code).Observe(took)
			if name == "PullImage" {
				pulls.WithLabelValues(code).Observe(took)
			}
			return err
		})
		return nil
	}
}
