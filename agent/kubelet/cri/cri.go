// Package cri is cairn-agent's client of the container runtime's CRI:
// containerd's RuntimeService and ImageService over its gRPC socket. It
// tells the node whether the runtime and its pod network are ready
// (node.RuntimeStatus) and which runtime it is (node.RuntimeInfo), and
// gives the pod worker its CRI clients.
//
//	c, err := cri.New("/run/containerd/containerd.sock")
//	w, err := pods.New(pods.Config{Runtime: c.Runtime, Images: c.Images, LogRoot: "/var/log/pods"})
//
// The connection is made lazily and made again whenever it breaks: a
// runtime that is not up yet, or restarts, makes calls fail until it is
// back, never the client.
package cri

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// maxMsgSize bounds the messages of the CRI, as large as the kubelet's:
// a ListContainers of a busy node is large.
const maxMsgSize = 16 << 20

// Client is a CRI client. Its methods may be called from many goroutines.
type Client struct {
	Runtime criv1.RuntimeServiceClient
	Images  criv1.ImageServiceClient
	conn    *grpc.ClientConn
}

// New returns a client of the CRI at the unix socket path. It does not
// connect: the first call does, and calls fail while the runtime is away.
func New(socket string, opts ...Option) (*Client, error) {
	var o options
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return nil, fmt.Errorf("CRI client for %s: %w", socket, err)
		}
	}
	conn, err := grpc.NewClient("unix://"+socket,
		grpc.WithChainUnaryInterceptor(o.interceptors...),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxMsgSize), grpc.MaxCallSendMsgSize(maxMsgSize)),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 200 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 5 * time.Second},
			MinConnectTimeout: 5 * time.Second,
		}),
	)
	if err != nil {
		return nil, fmt.Errorf("CRI client for %s: %w", socket, err)
	}
	return &Client{
		Runtime: criv1.NewRuntimeServiceClient(conn),
		Images:  criv1.NewImageServiceClient(conn),
		conn:    conn,
	}, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// RuntimeStatus asks the runtime's Status: whether its RuntimeReady and
// NetworkReady conditions hold, and if not, their reasons and messages.
func (c *Client) RuntimeStatus(ctx context.Context) (runtimeReady, networkReady bool, reason string, err error) {
	resp, err := c.Runtime.Status(ctx, &criv1.StatusRequest{})
	if err != nil {
		return false, false, "", fmt.Errorf("CRI status: %w", err)
	}
	return Ready(resp.GetStatus())
}

// Ready reads the RuntimeReady and NetworkReady conditions of a CRI
// status; reason tells why what is not ready is not, for a person.
func Ready(st *criv1.RuntimeStatus) (runtimeReady, networkReady bool, reason string, err error) {
	if st == nil {
		return false, false, "", errors.New("CRI status: runtime returned no status")
	}
	var why []string
	seen := map[string]bool{}
	for _, c := range st.Conditions {
		switch c.Type {
		case criv1.RuntimeReady:
			runtimeReady = c.Status
		case criv1.NetworkReady:
			networkReady = c.Status
		default:
			continue
		}
		seen[c.Type] = true
		if !c.Status {
			why = append(why, describe(c))
		}
	}
	for _, t := range []string{criv1.RuntimeReady, criv1.NetworkReady} {
		if !seen[t] {
			why = append(why, t+" not reported")
		}
	}
	return runtimeReady, networkReady, strings.Join(why, "; "), nil
}

func describe(c *criv1.RuntimeCondition) string {
	s := c.Type + "=false"
	if c.Reason != "" {
		s += " reason:" + c.Reason
	}
	if c.Message != "" {
		s += " message:" + c.Message
	}
	return s
}

// RuntimeVersion returns the runtime's name and version as a Node reports
// them, such as "containerd://2.4.2".
func (c *Client) RuntimeVersion(ctx context.Context) (string, error) {
	resp, err := c.Runtime.Version(ctx, &criv1.VersionRequest{})
	if err != nil {
		return "", fmt.Errorf("CRI version: %w", err)
	}
	if resp.RuntimeName == "" {
		return "", errors.New("CRI version: runtime gave no name")
	}
	return resp.RuntimeName + "://" + resp.RuntimeVersion, nil
}

// ImageFilesystem asks the runtime where it keeps its images: the mount
// point of its first image filesystem, whose free space is the
// imagefs.available signal.
func ImageFilesystem(ctx context.Context, images criv1.ImageServiceClient) (string, error) {
	resp, err := images.ImageFsInfo(ctx, &criv1.ImageFsInfoRequest{})
	if err != nil {
		return "", fmt.Errorf("CRI image filesystem: %w", err)
	}
	fss := resp.GetImageFilesystems()
	if len(fss) == 0 || fss[0].GetFsId().GetMountpoint() == "" {
		return "", errors.New("CRI image filesystem: the runtime named none")
	}
	return fss[0].GetFsId().GetMountpoint(), nil
}
