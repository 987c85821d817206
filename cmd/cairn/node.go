package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/cairn-os/cairn/api/client"
	"github.com/cairn-os/cairn/api/machine"
	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"
)

type nodeFlags struct {
	cairnconfig    string
	nodes          []string
	connectTimeout time.Duration
	output         string
}

// defaultClientConfig is $CAIRNCONFIG, else the file `cairn config gen`
// writes by default.
func defaultClientConfig() string {
	if v := os.Getenv("CAIRNCONFIG"); v != "" {
		return v
	}
	return "_out/cairnconfig"
}

// call is a verb without arguments that makes one call to each node,
// within callTimeout, writing to w.
func (f *nodeFlags) call(use, short string, run func(ctx context.Context, c *client.Client, w io.Writer) error) *cobra.Command {
	return &cobra.Command{
		Use: use, Short: short, Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return f.onNodes(cmd, callTimeout, func(ctx context.Context, n *target) error {
				return run(ctx, n.Client, n.Out)
			})
		},
	}
}

func nodeCmd() *cobra.Command {
	f := &nodeFlags{}
	cmd := &cobra.Command{Use: "node", Short: "Manage a running node through its API"}
	cmd.PersistentFlags().StringVar(&f.cairnconfig, "cairnconfig", defaultClientConfig(), "client config ($CAIRNCONFIG)")
	cmd.PersistentFlags().StringSliceVarP(&f.nodes, "nodes", "n", nil, "node endpoints HOST:PORT, comma-separated: the verb runs on each at once (default: the client config's first endpoint)")
	cmd.PersistentFlags().DurationVar(&f.connectTimeout, "connect-timeout", 10*time.Second, "how long to wait for a node to answer before it counts as failed")
	call := f.call
	version := call("version", "Show what the node runs and how it booted", func(ctx context.Context, c *client.Client, w io.Writer) error {
		v, err := c.Version(ctx, &machine.VersionRequest{})
		if err != nil {
			return err
		}
		if f.output == "json" {
			out, err := protojson.MarshalOptions{Multiline: true}.Marshal(v)
			if err != nil {
				return err
			}
			_, err = fmt.Fprintln(w, string(out))
			return err
		}
		printVersion(w, v)
		return nil
	})
	version.Flags().StringVarP(&f.output, "output", "o", "text", "text or json")
	var tail int
	var follow bool
	var pod, container string
	logs := &cobra.Command{
		Use:   "logs {SERVICE | --pod [NAMESPACE/]POD [-c CONTAINER]}",
		Short: "Show a service's output, or a pod container's (-f to follow)",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if (pod == "") == (len(args) == 0) {
				return errors.New("name a service, or a pod with --pod")
			}
			return f.onNodes(cmd, 0, func(ctx context.Context, n *target) error {
				var stream grpc.ServerStreamingClient[machine.LogsChunk]
				var err error
				if pod != "" {
					ns, name, ok := strings.Cut(pod, "/")
					if !ok {
						ns, name = "default", pod
					}
					stream, err = n.Client.PodLogs(ctx, &machine.PodLogsRequest{Namespace: ns, Pod: name, Container: container, TailLines: int32(tail), Follow: follow})
				} else {
					stream, err = n.Client.Logs(ctx, &machine.LogsRequest{Service: args[0], TailLines: int32(tail), Follow: follow})
				}
				if err != nil {
					return err
				}
				for {
					chunk, err := stream.Recv()
					if err == io.EOF {
						return nil
					}
					if err != nil {
						return err
					}
					if _, err := n.Out.Write(chunk.Data); err != nil {
						return err
					}
				}
			})
		},
	}
	logs.Flags().IntVar(&tail, "tail", 0, "lines from the end to show first (0: all kept)")
	logs.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing new output")
	logs.Flags().StringVar(&pod, "pod", "", "a pod on the node, NAMESPACE/NAME (namespace default if omitted), read from its container logs")
	logs.Flags().StringVarP(&container, "container", "c", "", "the pod's container (needed if it has several)")
	var signal int
	kill := &cobra.Command{
		Use: "kill SERVICE", Short: "Send a signal (default SIGKILL) to a service; the supervisor restarts it per its policy", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return f.onNodes(cmd, callTimeout, func(ctx context.Context, n *target) error {
				_, err := n.Client.ServiceKill(ctx, &machine.ServiceKillRequest{Name: args[0], Signal: int32(signal)})
				return err
			})
		},
	}
	kill.Flags().IntVarP(&signal, "signal", "s", 9, "signal number")
	restart := &cobra.Command{
		Use: "restart SERVICE", Short: "Stop a service and start it again", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return f.onNodes(cmd, callTimeout, func(ctx context.Context, n *target) error {
				if _, err := n.Client.ServiceRestart(ctx, &machine.ServiceRestartRequest{Name: args[0]}); err != nil {
					return err
				}
				_, err := fmt.Fprintf(n.Out, "restarted %s\n", args[0])
				return err
			})
		},
	}
	cmd.AddCommand(metricsCmd(f), auditCmd(f))
	cmd.AddCommand(inspectCmds(f)...)
	cmd.AddCommand(applyCmds(f)...)
	cmd.AddCommand(upgradeCmds(f)...)
	cmd.AddCommand(probeCmds(f)...)
	cmd.AddCommand(logs, kill, restart,
		call("services", "List the services and their state", func(ctx context.Context, c *client.Client, w io.Writer) error {
			resp, err := c.Services(ctx, &machine.ServicesRequest{})
			if err != nil {
				return err
			}
			printServices(w, resp.Services)
			return nil
		}),
		call("containers", "List containerd's namespaces, containers and images", func(ctx context.Context, c *client.Client, w io.Writer) error {
			resp, err := c.Containers(ctx, &machine.ContainersRequest{})
			if err != nil {
				return err
			}
			printContainers(w, resp.Namespaces)
			return nil
		}),
	)
	cmd.AddCommand(version,
		call("reboot", "Stop services cleanly and reboot", func(ctx context.Context, c *client.Client, w io.Writer) error {
			if _, err := c.Reboot(ctx, &machine.RebootRequest{}); err != nil {
				return err
			}
			_, err := fmt.Fprintln(w, "rebooting")
			return err
		}),
		call("shutdown", "Stop services cleanly and power off", func(ctx context.Context, c *client.Client, w io.Writer) error {
			if _, err := c.Shutdown(ctx, &machine.ShutdownRequest{}); err != nil {
				return err
			}
			_, err := fmt.Fprintln(w, "powering off")
			return err
		}),
	)
	return cmd
}

func printServices(w io.Writer, services []*machine.ServiceStatus) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SERVICE\tSTATE\tREADY\tRESTARTS\tSINCE\tPID\tLIMITS\tLAST EXIT\tREASON")
	for _, s := range services {
		since := ""
		if s.Since != nil {
			since = time.Since(s.Since.AsTime()).Round(time.Second).String()
		}
		fmt.Fprintf(tw, "%s\t%s\t%t\t%d\t%s\t%d\t%s\t%s\t%s\n", s.Name, s.State, s.Ready, s.Restarts, since, s.Pid, limits(s.Limits), s.LastExit, s.Reason)
	}
	tw.Flush()
}

// limits sums up the limits a service's cgroup has, "-" for none (or no
// process to read them from).
func limits(l *machine.CgroupLimits) string {
	var out []string
	if b, err := strconv.ParseInt(l.GetMemoryMax(), 10, 64); err == nil {
		out = append(out, "mem "+bytesIEC(b))
	}
	if quota, period, ok := strings.Cut(l.GetCpuMax(), " "); ok && quota != "max" {
		q, err1 := strconv.ParseFloat(quota, 64)
		p, err2 := strconv.ParseFloat(period, 64)
		if err1 == nil && err2 == nil && p > 0 {
			out = append(out, "cpu "+strconv.FormatFloat(q/p, 'f', -1, 64))
		}
	}
	if w := l.GetCpuWeight(); w != "" && w != "100" {
		out = append(out, "weight "+w)
	}
	if p := l.GetPidsMax(); p != "" && p != "max" {
		out = append(out, "pids "+p)
	}
	if len(out) == 0 {
		return "-"
	}
	return strings.Join(out, ", ")
}

// bytesIEC writes b in the largest binary unit that divides it.
func bytesIEC(b int64) string {
	for _, u := range []struct {
		suffix string
		size   int64
	}{{"Ti", 1 << 40}, {"Gi", 1 << 30}, {"Mi", 1 << 20}, {"Ki", 1 << 10}} {
		if b >= u.size && b%u.size == 0 {
			return strconv.FormatInt(b/u.size, 10) + u.suffix
		}
	}
	return strconv.FormatInt(b, 10)
}

func printContainers(w io.Writer, namespaces []*machine.ContainerNamespace) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAMESPACE\tCONTAINER\tIMAGE\tSTATUS\tPID")
	for _, ns := range namespaces {
		for _, c := range ns.Containers {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\n", ns.Name, c.Id, c.Image, c.Status, c.Pid)
		}
	}
	fmt.Fprintln(tw, "\nNAMESPACE\tIMAGE\tDIGEST\tSIZE")
	for _, ns := range namespaces {
		for _, im := range ns.Images {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\n", ns.Name, im.Name, im.Digest, im.Size)
		}
	}
	tw.Flush()
}

func printVersion(w io.Writer, v *machine.VersionResponse) {
	fmt.Fprintf(w, "Cairn:      %s\nKernel:     %s\nHostname:   %s\nAddresses:  %s\nUptime:     %s\nBoot timeline (from kernel start):\n",
		v.CairnVersion, v.Kernel, v.Hostname, strings.Join(v.Addresses, ", "), v.Uptime.AsDuration().Round(time.Second))
	for _, s := range v.BootTimeline {
		line := fmt.Sprintf("  %8.3fs  %7.3fs  %s", s.Start.AsDuration().Seconds(), s.Duration.AsDuration().Seconds(), s.Name)
		if s.Error != "" {
			line += "  (failed: " + s.Error + ")"
		}
		fmt.Fprintln(w, line)
	}
	if v.Config != nil {
		fmt.Fprintf(w, "Config:     %s\n", configState(v.Config))
	}
	if v.Boot != nil {
		fmt.Fprintf(w, "Boot:       %s\n", bootState(v.Boot))
	}
	if ts := v.TimeSync; ts != nil {
		line := "Time sync:  not synced"
		if ts.Synced {
			line = "Time sync:  synced"
		}
		if ts.LastSync != nil {
			line += fmt.Sprintf(", last from %s at %s (offset %s)", ts.Server, ts.LastSync.AsTime().Format(time.RFC3339), ts.Offset.AsDuration())
		}
		if ts.Error != "" {
			line += "; " + ts.Error
		}
		fmt.Fprintln(w, line)
	}
}
