package main

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"

	"github.com/cairn-os/cairn/machineconfig"
	"github.com/cairn-os/cairn/machineconfig/staticpod"
	"github.com/spf13/cobra"
)

func configCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "config", Short: "Generate, validate, patch and compare machine configs"}
	cmd.AddCommand(configGenCmd(), configValidateCmd(), configSchemaCmd())
	return cmd
}

func configGenCmd() *cobra.Command {
	var (
		opts  machineconfig.GenerateOptions
		dir   string
		force bool
	)
	cmd := &cobra.Command{
		Use:   "gen",
		Short: "Generate a machine config, its API CA and an admin client config",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			b, err := machineconfig.Generate(opts)
			if err != nil {
				return err
			}
			if err := b.Write(dir, force); err != nil {
				if errors.Is(err, fs.ErrExist) {
					return fmt.Errorf("%w (pass --force to replace the files, including the CA)", err)
				}
				return err
			}
			out := cmd.OutOrStdout()
			for _, name := range []string{
				machineconfig.MachineConfigFile,
				machineconfig.CACertFile,
				machineconfig.CAKeyFile,
				machineconfig.ClientConfigFile,
			} {
				fmt.Fprintln(out, "wrote", filepath.Join(dir, name))
			}
			fmt.Fprintf(out, "next: cairn image build -c %s -o %s\n",
				filepath.Join(dir, machineconfig.MachineConfigFile), filepath.Join(dir, "node.raw"))
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&dir, "out", "_out", "directory to write the files to")
	f.StringVar(&opts.Hostname, "hostname", "cairn-node", "node hostname")
	f.StringVar(&opts.Interface, "interface", "", "link to configure (default: the first link that is not loopback)")
	f.StringArrayVar(&opts.Addresses, "address", nil, "static address in CIDR notation, e.g. 10.0.2.15/24 (repeatable; default: DHCP)")
	f.StringVar(&opts.Gateway, "gateway", "", "default gateway for the static addresses")
	f.StringArrayVar(&opts.Nameservers, "nameserver", nil, "DNS server IP address (repeatable)")
	f.StringArrayVar(&opts.Endpoints, "endpoint", []string{"127.0.0.1:50000"}, "node API address HOST:PORT for the client config; the server certificate covers its host (repeatable)")
	f.BoolVar(&force, "force", false, "overwrite existing files, including the CA")
	return cmd
}

func configValidateCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "validate FILE",
		Short: "Check a machine config and list every problem",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if _, err := staticpod.Load(args[0]); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s: valid\n", args[0])
			return nil
		},
	}
}

func configSchemaCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "schema",
		Short: "Print the machine config's JSON Schema, for editors",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := cmd.OutOrStdout().Write(machineconfig.Schema())
			return err
		},
	}
}
