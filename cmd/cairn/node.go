package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/cairn-os/cairn/api/client"
	"github.com/cairn-os/cairn/api/machine"
	"github.com/cairn-os/cairn/machineconfig"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/encoding/protojson"
)

type nodeFlags struct {
	cairnconfig string
	node        string
	output      string
}

// defaultClientConfig is $CAIRNCONFIG, else the file `cairn config gen`
// writes by default.
func defaultClientConfig() string {
	if v := os.Getenv("CAIRNCONFIG"); v != "" {
		return v
	}
	return "_out/cairnconfig"
}

func (f *nodeFlags) dial() (*client.Client, error) {
	cc, err := machineconfig.LoadClientConfig(f.cairnconfig)
	if err != nil {
		return nil, fmt.Errorf("%w (make one with `cairn config gen`, or point --cairnconfig at it)", err)
	}
	endpoint := f.node
	if endpoint == "" {
		if len(cc.Endpoints) == 0 {
			return nil, fmt.Errorf("%s lists no endpoints: pass --nodes HOST:PORT", f.cairnconfig)
		}
		endpoint = cc.Endpoints[0]
	}
	return client.Dial(cc, endpoint)
}

func nodeCmd() *cobra.Command {
	f := &nodeFlags{}
	cmd := &cobra.Command{Use: "node", Short: "Manage a running node through its API"}
	cmd.PersistentFlags().StringVar(&f.cairnconfig, "cairnconfig", defaultClientConfig(), "client config ($CAIRNCONFIG)")
	cmd.PersistentFlags().StringVarP(&f.node, "nodes", "n", "", "node endpoint HOST:PORT (default: the client config's first endpoint)")
	call := func(use, short string, run func(context.Context, *client.Client, io.Writer) error) *cobra.Command {
		return &cobra.Command{
			Use: use, Short: short, Args: cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				c, err := f.dial()
				if err != nil {
					return err
				}
				defer c.Close()
				ctx, cancel := context.WithTimeout(cmd.Context(), 30*time.Second)
				defer cancel()
				return run(ctx, c, cmd.OutOrStdout())
			},
		}
	}
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
}
