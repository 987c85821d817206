// Package client connects to the management API of a Cairn node with the
// operator's client config.
package client

import (
	"fmt"
	"net"

	"github.com/cairn-os/cairn/api/machine"
	"github.com/cairn-os/cairn/machineconfig"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// Client is a connection to one node.
type Client struct {
	machine.MachineClient
	conn *grpc.ClientConn
}

// Dial connects to the node at endpoint (host:port) over mutual TLS, with
// opts added to the connection's. The node's certificate must name the
// endpoint's host.
func Dial(cc *machineconfig.ClientConfig, endpoint string, opts ...grpc.DialOption) (*Client, error) {
	host, _, err := net.SplitHostPort(endpoint)
	if err != nil {
		return nil, fmt.Errorf("endpoint %q: want host:port: %w", endpoint, err)
	}
	tlsCfg, err := cc.TLSConfig(host)
	if err != nil {
		return nil, err
	}
	opts = append([]grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg))}, opts...)
	conn, err := grpc.NewClient(endpoint, opts...)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", endpoint, err)
	}
	return &Client{MachineClient: machine.NewMachineClient(conn), conn: conn}, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }
