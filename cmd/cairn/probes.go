package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/cairn-os/cairn/api/client"
	"github.com/cairn-os/cairn/api/machine"
)

// probeCmds are the checks an operator runs from the node instead of
// from a shell on it: ping, a DNS lookup, a TCP connect.
func probeCmds(f *nodeFlags) []*cobra.Command {
	var (
		count          uint32
		interval, wait time.Duration
		connectTimeout time.Duration
	)
	ping := &cobra.Command{
		Use: "ping ADDRESS [-c COUNT] [-i INTERVAL]", Short: "Ping an address from the node (ICMP echo)", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return f.onNodes(cmd, 0, func(ctx context.Context, n *target) error {
				s, err := n.Client.Ping(ctx, &machine.PingRequest{Address: args[0], Count: count, Interval: durationpb.New(interval), Timeout: durationpb.New(wait)})
				if err != nil {
					return err
				}
				sent, got := 0, 0
				for {
					r, err := s.Recv()
					if err == io.EOF {
						break
					}
					if err != nil {
						return err
					}
					sent++
					if r.Error != "" {
						fmt.Fprintf(n.Out, "seq=%d: %s\n", r.Seq, r.Error)
						continue
					}
					got++
					fmt.Fprintf(n.Out, "reply from %s: seq=%d time=%s\n", r.From, r.Seq, r.Rtt.AsDuration().Round(10*time.Microsecond))
				}
				fmt.Fprintf(n.Out, "%d sent, %d received\n", sent, got)
				if got == 0 {
					return fmt.Errorf("no reply from %s", args[0])
				}
				return nil
			})
		},
	}
	ping.Flags().Uint32VarP(&count, "count", "c", 4, "echo requests to send (at most 100)")
	ping.Flags().DurationVarP(&interval, "interval", "i", time.Second, "between two requests (at least 200ms)")
	ping.Flags().DurationVarP(&wait, "timeout", "W", 2*time.Second, "how long to wait for each reply")

	lookup := &cobra.Command{
		Use: "lookup NAME", Short: "Resolve a name as the node does (/etc/hosts, then its nameservers)", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return f.onNodes(cmd, callTimeout, func(ctx context.Context, n *target) error {
				return printLookup(ctx, n.Client, n.Out, args[0])
			})
		},
	}
	connect := &cobra.Command{
		Use: "connect HOST:PORT [--timeout D]", Short: "Open a TCP connection from the node, and close it", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return f.onNodes(cmd, callTimeout+connectTimeout, func(ctx context.Context, n *target) error {
				r, err := n.Client.Connect(ctx, &machine.ConnectRequest{Address: args[0], Timeout: durationpb.New(connectTimeout)})
				if err != nil {
					return err
				}
				_, err = fmt.Fprintf(n.Out, "connected to %s from %s in %s\n", r.Remote, r.Local, r.Duration.AsDuration().Round(10*time.Microsecond))
				return err
			})
		},
	}
	connect.Flags().DurationVar(&connectTimeout, "timeout", 5*time.Second, "how long the connection may take to open")
	return []*cobra.Command{ping, lookup, connect}
}

func printLookup(ctx context.Context, c *client.Client, w io.Writer, name string) error {
	r, err := c.Lookup(ctx, &machine.LookupRequest{Name: name})
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s: %s (%s)\n", name, strings.Join(r.Addresses, ", "), r.Duration.AsDuration().Round(10*time.Microsecond))
	return err
}
