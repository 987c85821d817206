package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/cairn-os/cairn/image/build"
	"github.com/dustin/go-humanize"
	"github.com/spf13/cobra"
)

func imageCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "image", Short: "Build disk images"}
	var o build.Options
	var size string
	b := &cobra.Command{
		Use:   "build -c MACHINE.yaml -o OUTPUT [--uki]",
		Short: "Build a bootable disk image (or with --uki its UKI alone) from a machine config",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if size != "" {
				n, err := humanize.ParseBytes(size)
				if err != nil {
					return fmt.Errorf("--size %q: %w", size, err)
				}
				o.Size = int64(n)
			}
			epoch, err := sourceDateEpoch()
			if err != nil {
				return err
			}
			o.SourceDateEpoch = epoch
			if o.Assets == "" {
				o.Assets = defaultAssets()
			}
			o.Progress = func(line string) { fmt.Fprintln(cmd.ErrOrStderr(), line) }
			if _, err := build.Build(cmd.Context(), o); err != nil {
				return err
			}
			next := "cairn qemu run " + o.Output
			if o.UKI {
				next = "cairn node upgrade --image " + o.Output
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %s and %s\nnext: %s\n",
				o.Output, filepath.Join(filepath.Dir(o.Output), "manifest.json"), next)
			return nil
		},
	}
	b.Flags().StringVarP(&o.Config, "config", "c", "", "machine config (required)")
	b.Flags().StringVarP(&o.Output, "output", "o", "", "disk image to write (required)")
	b.Flags().StringVar(&o.Format, "format", "raw", "output format: raw or qcow2")
	b.Flags().BoolVar(&o.UKI, "uki", false, "write the UKI alone (kernel, initramfs, command line), to upgrade a node with")
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

// sourceDateEpoch is SOURCE_DATE_EPOCH from the environment, the time
// reproducible builds stamp their files with, or 0 (the build's default)
// when it is unset.
func sourceDateEpoch() (int64, error) {
	v := os.Getenv("SOURCE_DATE_EPOCH")
	if v == "" {
		return 0, nil
	}
	e, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("SOURCE_DATE_EPOCH=%q: want seconds since 1970: %w", v, err)
	}
	return e, nil
}
