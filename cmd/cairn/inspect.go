package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/cairn-os/cairn/api/client"
	"github.com/cairn-os/cairn/api/machine"
	"github.com/spf13/cobra"
	"google.golang.org/grpc"
)

// inspectCmds are the read-only looks at a node that stand in for a
// shell: the kernel log, mounts, processes, network and files.
func inspectCmds(f *nodeFlags) []*cobra.Command {
	var follow bool
	dmesg := &cobra.Command{
		Use: "dmesg [-f]", Short: "Show the kernel log (-f to follow)", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return stream(cmd, f, func(ctx context.Context, c *client.Client) (grpc.ServerStreamingClient[machine.DmesgRecord], error) {
				return c.Dmesg(ctx, &machine.DmesgRequest{Follow: follow})
			}, func(w io.Writer, r *machine.DmesgRecord) error {
				_, err := io.WriteString(w, dmesgLine(r))
				return err
			})
		},
	}
	dmesg.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing new records")
	var limit int64
	read := &cobra.Command{
		Use: "read PATH", Short: "Print a file under /var/log, /proc, /sys or /etc (never a secret)", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return stream(cmd, f, func(ctx context.Context, c *client.Client) (grpc.ServerStreamingClient[machine.ReadChunk], error) {
				return c.Read(ctx, &machine.ReadRequest{Path: args[0], Limit: limit})
			}, func(w io.Writer, ch *machine.ReadChunk) error {
				if _, err := w.Write(ch.Data); err != nil {
					return err
				}
				if ch.Truncated {
					fmt.Fprintf(cmd.ErrOrStderr(), "cairn: %s goes on past the limit: truncated (raise --limit, up to 16 MiB)\n", args[0])
				}
				return nil
			})
		},
	}
	read.Flags().Int64Var(&limit, "limit", 1<<20, "bytes to print at most (0: the node's limit, 16 MiB)")
	var followEvents bool
	var tail uint32
	events := &cobra.Command{
		Use: "events [-f] [--tail N]", Short: "Show what happened on the node: boot steps, services, configs, upgrades, shutdowns, audited calls", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return stream(cmd, f, func(ctx context.Context, c *client.Client) (grpc.ServerStreamingClient[machine.Event], error) {
				return c.Events(ctx, &machine.EventsRequest{Follow: followEvents, Tail: tail})
			}, func(w io.Writer, e *machine.Event) error {
				_, err := io.WriteString(w, eventLine(e))
				return err
			})
		},
	}
	events.Flags().BoolVarP(&followEvents, "follow", "f", false, "keep printing new events")
	events.Flags().Uint32Var(&tail, "tail", 0, "only the last N kept events of each source (0: all)")
	return []*cobra.Command{dmesg, read, events,
		f.call("mounts", "List the node's mounts", func(ctx context.Context, c *client.Client, w io.Writer) error {
			resp, err := c.Mounts(ctx, &machine.MountsRequest{})
			if err != nil {
				return err
			}
			printMounts(w, resp.Mounts)
			return nil
		}),
		f.call("processes", "List the node's processes: pid, parent, state, CPU, RSS, cgroup, command", func(ctx context.Context, c *client.Client, w io.Writer) error {
			resp, err := c.Processes(ctx, &machine.ProcessesRequest{})
			if err != nil {
				return err
			}
			printProcesses(w, resp.Processes)
			return nil
		}),
		f.call("network", "Show links, addresses, routes, TCP and UDP sockets and the nftables ruleset", func(ctx context.Context, c *client.Client, w io.Writer) error {
			resp, err := c.Network(ctx, &machine.NetworkRequest{})
			if err != nil {
				return err
			}
			printNetwork(w, resp)
			return nil
		}),
	}
}

// stream hands each message of a server stream from each node to each,
// with the node's output, until the node ends it or the user interrupts.
func stream[T any](cmd *cobra.Command, f *nodeFlags, open func(context.Context, *client.Client) (grpc.ServerStreamingClient[T], error), each func(io.Writer, *T) error) error {
	return f.onNodes(cmd, 0, func(ctx context.Context, n *target) error {
		s, err := open(ctx, n.Client)
		if err != nil {
			return err
		}
		for {
			m, err := s.Recv()
			if err == io.EOF {
				return nil
			}
			if err != nil {
				return err
			}
			if err := each(n.Out, m); err != nil {
				return err
			}
		}
	})
}

// eventLine writes an event on one line: its time (UTC), kind, subject
// and message.
func eventLine(e *machine.Event) string {
	return fmt.Sprintf("%s  %-8s %-24s %s\n", e.Time.AsTime().UTC().Format("2006-01-02T15:04:05.000Z"), e.Kind, e.Subject, e.Message)
}

var (
	syslogLevels     = []string{"emerg", "alert", "crit", "err", "warn", "notice", "info", "debug"}
	syslogFacilities = []string{"kern", "user", "mail", "daemon", "auth", "syslog", "lpr", "news"}
)

// dmesgLine writes a record as dmesg(1) does, with its facility and level
// up front: "[    5.140900] kern.info  NET: Registered protocol family 10".
func dmesgLine(r *machine.DmesgRecord) string {
	fac := strconv.Itoa(int(r.Facility))
	if int(r.Facility) < len(syslogFacilities) {
		fac = syslogFacilities[r.Facility]
	}
	return fmt.Sprintf("[%12.6f] %-11s %s\n", r.Time.AsDuration().Seconds(), fac+"."+syslogLevels[r.Level&7], r.Message)
}

func printMounts(w io.Writer, mounts []*machine.Mount) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SOURCE\tTARGET\tTYPE\tOPTIONS\tFS OPTIONS")
	for _, m := range mounts {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", m.Source, m.Target, m.Type, m.Options, m.SuperOptions)
	}
	tw.Flush()
}

func printProcesses(w io.Writer, procs []*machine.Process) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PID\tPPID\tSTATE\tCPU\tRSS\tCGROUP\tCOMMAND")
	for _, p := range procs {
		fmt.Fprintf(tw, "%d\t%d\t%s\t%.2fs\t%s\t%s\t%s\n", p.Pid, p.Parent, p.State, p.CpuTime.AsDuration().Seconds(), mebibytes(p.Rss), p.Cgroup, p.Command)
	}
	tw.Flush()
}

// mebibytes writes a size in MiB with one decimal, as a glance needs.
func mebibytes(b uint64) string {
	return strconv.FormatFloat(float64(b)/(1<<20), 'f', 1, 64) + "Mi"
}

// routeTables names the routing tables ip-route(8) names.
var routeTables = map[uint32]string{253: "default", 254: "main", 255: "local"}

func printNetwork(w io.Writer, n *machine.NetworkResponse) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "LINK\tSTATE\tMTU\tMAC\tTYPE\tADDRESSES")
	for _, l := range n.Links {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\n", l.Name, l.State, l.Mtu, l.Mac, l.Type, strings.Join(l.Addresses, ", "))
	}
	fmt.Fprintln(tw, "\nDESTINATION\tGATEWAY\tDEVICE\tSOURCE\tTABLE\tMETRIC\tTYPE")
	for _, r := range n.Routes {
		table, ok := routeTables[r.Table]
		if !ok {
			table = strconv.Itoa(int(r.Table))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\n", r.Destination, r.Gateway, r.Device, r.Source, table, r.Metric, r.Type)
	}
	fmt.Fprintln(tw, "\nPROTO\tSTATE\tLOCAL\tREMOTE\tPID\tCOMMAND")
	for _, s := range n.Sockets {
		pid := ""
		if s.Pid > 0 {
			pid = strconv.Itoa(int(s.Pid))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", s.Protocol, s.State, s.Local, s.Remote, pid, s.Command)
	}
	tw.Flush()
	fmt.Fprintf(w, "\nnftables:\n%s", n.Nftables)
}
