package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/cairn-os/cairn/image/build"
	"github.com/dustin/go-humanize"
	"github.com/spf13/cobra"
)

func imageCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "image", Short: "Build disk images"}
	var o build.Options
	var size string
	b := &cobra.Command{
		Use:   "build -c MACHINE.yaml -o OUTPUT",
		Short: "Build a bootable disk image from a machine config",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if size != "" {
				n, err := humanize.ParseBytes(size)
				if err != nil {
					return fmt.Errorf("--size %q: %w", size, err)
				}
				o.Size = int64(n)
			}
			if o.Assets == "" {
				o.Assets = defaultAssets()
			}
			o.Progress = func(line string) { fmt.Fprintln(cmd.ErrOrStderr(), line) }
			if _, err := build.Build(cmd.Context(), o); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %s and %s\nnext: cairn qemu run %s\n",
				o.Output, filepath.Join(filepath.Dir(o.Output), "manifest.json"), o.Output)
			return nil
		},
	}
	b.Flags().StringVarP(&o.Config, "config", "c", "", "machine config (required)")
	b.Flags().StringVarP(&o.Output, "output", "o", "", "disk image to write (required)")
	b.Flags().StringVar(&o.Format, "format", "raw", "output format: raw or qcow2")
	b.Flags().StringVar(&o.Assets, "assets", "", "directory with the node binaries init and cairn-agent (default: beside this program)")
	b.Flags().StringVar(&o.CacheDir, "cache", "", "kernel download cache (default $CAIRN_CACHE or ~/.cache/cairn)")
	b.Flags().StringVar(&size, "size", "", "disk size, e.g. 8GiB (default 2GiB)")
	b.MarkFlagRequired("config")
	b.MarkFlagRequired("output")
	cmd.AddCommand(b)
	return cmd
}

// defaultAssets is the directory of the running cairn binary: `make` puts
// init and cairn-agent beside it.
func defaultAssets() string {
	exe, err := os.Executable()
	if err != nil {
		return "."
	}
	return filepath.Dir(exe)
}
