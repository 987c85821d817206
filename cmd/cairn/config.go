package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"github.com/cairn-os/cairn/image"
	"github.com/cairn-os/cairn/machineconfig"
	"github.com/cairn-os/cairn/machineconfig/staticpod"
	"github.com/spf13/cobra"
)

func configCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "config", Short: "Generate, validate, patch and compare machine configs"}
	cmd.AddCommand(configGenCmd(), configValidateCmd(), configSchemaCmd(), configPatchCmd(), configDiffCmd())
	return cmd
}

func configGenCmd() *cobra.Command {
	var (
		opts       machineconfig.GenerateOptions
		dir        string
		force      bool
		secureBoot bool
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
			next := ""
			if secureBoot {
				keys, err := image.GenerateSecureBootKeys(filepath.Join(dir, secureBootDir))
				if err != nil {
					return err
				}
				fmt.Fprintln(out, "wrote the Secure Boot keys PK, KEK and db in", keys)
				next = " --secure-boot " + string(keys)
			}
			fmt.Fprintf(out, "next: cairn image build -c %s -o %s%s\n",
				filepath.Join(dir, machineconfig.MachineConfigFile), filepath.Join(dir, "node.raw"), next)
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
	f.BoolVar(&secureBoot, "secure-boot", false, "also make UEFI Secure Boot keys (PK, KEK, db) in OUT/"+secureBootDir+", for image build --secure-boot; never overwritten")
	return cmd
}

// secureBootDir is where config gen writes the Secure Boot keys, in its
// output directory.
const secureBootDir = "secureboot"

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

func configPatchCmd() *cobra.Command {
	var (
		patches []string
		out     string
	)
	cmd := &cobra.Command{
		Use:   "patch FILE --patch P [--patch P]...",
		Short: "Patch a machine config with JSON patches (RFC 6902) or merge patches (RFC 7386), and check the result",
		Long: `Patch applies each patch in order to the machine config FILE, checks the
result as validate does, and prints it as YAML with its defaults filled
in, as the node reads it, or writes it to -o FILE.
A patch P is the file named P if there is one, else P itself; in YAML or
JSON, a list is a JSON patch and an object a merge patch. Nothing is
printed or written unless every patch applies and the result is valid.`,
		Example: `  cairn config patch machine.yaml --patch '[{op: replace, path: /machine/hostname, value: node-2}]'
  cairn config patch machine.yaml --patch 'machine: {sysctls: {vm.swappiness: "10"}}' -o machine.yaml`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(patches) == 0 {
				return errors.New("no --patch given")
			}
			doc, err := os.ReadFile(args[0])
			if err != nil {
				return fmt.Errorf("read machine config: %w", err)
			}
			for i, p := range patches {
				patch, name := []byte(p), fmt.Sprintf("--patch %d", i+1)
				if data, err := os.ReadFile(p); err == nil {
					patch, name = data, p
				} else if !notAFile(err) {
					return fmt.Errorf("read patch %s: %w", p, err)
				}
				if doc, err = machineconfig.ApplyPatch(doc, patch); err != nil {
					return fmt.Errorf("nothing written: %s: %w", name, err)
				}
			}
			c, err := staticpod.Parse(doc)
			if err != nil {
				return fmt.Errorf("nothing written: the patched config: %w", err)
			}
			data, err := c.Marshal()
			if err != nil {
				return err
			}
			if out == "" {
				_, err = cmd.OutOrStdout().Write(data)
				return err
			}
			return writeFileAtomic(out, data)
		},
	}
	cmd.Flags().StringArrayVar(&patches, "patch", nil, "a patch, or a file holding one (repeatable; applied in order)")
	cmd.Flags().StringVarP(&out, "output", "o", "", "write the result to this file (0600: it holds the node's key) instead of printing it")
	return cmd
}

// notAFile reports whether err, from reading a patch as a file, says
// there is none by that name: the patch is then the argument itself.
func notAFile(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENAMETOOLONG) || errors.Is(err, syscall.ENOTDIR)
}

// writeFileAtomic replaces path with data (mode 0600), whole or not at
// all: a temporary file beside it, synced, renamed over it.
func writeFileAtomic(path string, data []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer os.Remove(f.Name()) // fails once renamed
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

func configDiffCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "diff OLD NEW",
		Short: "List what differs between two machine configs, field by field",
		Long: `Diff checks both configs as validate does and prints one line per changed
field, by its path, defaults filled in: "path: old → new", "path: added
value", "path: removed value". Secrets are not shown, nor long values,
which are their size and digest. It exits 0 either way.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			var configs [2]*machineconfig.Config
			for i, path := range args {
				c, err := staticpod.Load(path)
				if err != nil {
					return err
				}
				configs[i] = c
			}
			w := cmd.OutOrStdout()
			changes := machineconfig.Diff(configs[0], configs[1])
			for _, c := range changes {
				fmt.Fprintln(w, c)
			}
			if len(changes) == 0 {
				fmt.Fprintln(w, "no change")
			}
			return nil
		},
	}
}
