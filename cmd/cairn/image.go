package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/dustin/go-humanize"
	"github.com/spf13/cobra"

	"github.com/cairn-os/cairn/image"
	"github.com/cairn-os/cairn/image/build"
	"github.com/cairn-os/cairn/image/oci"
	"github.com/cairn-os/cairn/internal/bootentry"
	"github.com/cairn-os/cairn/machineconfig/staticpod"
)

func imageCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "image", Short: "Build disk images"}
	var o build.Options
	var size, configs string
	b := &cobra.Command{
		Use:   "build -c MACHINE.yaml -o OUTPUT [--uki] | --configs DIR -o OUTDIR",
		Short: "Build a bootable disk image (or with --uki its UKI alone) from a machine config, or one per config of a directory",
		Long: `Build writes a disk image, and manifest.json beside it, from a machine
config. The UKI and the EFI system partition of recent builds are kept in
the cache (--cache), keyed by the digest of all that makes them: a build
whose kernel, node binaries and kernel arguments have not changed reuses
them and writes only the disk. --no-cache builds them anew.

With --generic, the image holds no machine config: at its first boot
the node takes one from a NoCloud volume (cairn image cidata) and keeps it.

With --configs DIR, it builds an image for each DIR/NAME.yaml into the
directory OUTDIR: NAME.raw (or the format's extension) and
NAME.manifest.json, every config validated first.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if n := btoi(o.Config != "") + btoi(configs != "") + btoi(o.Generic); n != 1 {
				return errors.New("name one machine config with -c FILE, a directory of them with --configs DIR, or ask for --generic")
			}
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
			next := "cairn qemu run "
			if o.UKI {
				next = "cairn node upgrade --image "
			}
			if configs != "" {
				o.Config = configs
				outs, err := build.BuildAll(cmd.Context(), o)
				if err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "wrote %d images and their manifests into %s\nnext: %s%s\n", len(outs), o.Output, next, outs[0])
				return nil
			}
			if _, err := build.Build(cmd.Context(), o); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %s and %s\nnext: %s%s\n",
				o.Output, filepath.Join(filepath.Dir(o.Output), "manifest.json"), next, o.Output)
			return nil
		},
	}
	b.Flags().StringVarP(&o.Config, "config", "c", "", "machine config")
	b.Flags().BoolVar(&o.Generic, "generic", false, "an image with no machine config, which it takes at first boot from a NoCloud volume (cairn image cidata)")
	b.Flags().StringArrayVar(&o.KernelArgs, "kernel-arg", nil, "with --generic, a kernel argument, e.g. cairn.config.url=URL and cairn.config.sha256=HEX; repeatable")
	b.Flags().StringVar(&configs, "configs", "", "directory of machine configs (*.yaml): one image each, into the directory -o")
	b.Flags().StringVarP(&o.Output, "output", "o", "", "disk image to write, or with --configs the directory (required)")
	b.Flags().StringVar(&o.Format, "format", "raw", "output format: "+strings.Join(image.Formats(), ", "))
	b.Flags().BoolVar(&o.UKI, "uki", false, "write the UKI alone (kernel, initramfs, command line), to upgrade a node with")
	b.Flags().StringVar(&o.Assets, "assets", "", "directory with the node binaries init and cairn-agent (default: beside this program)")
	b.Flags().StringVar(&o.CacheDir, "cache", "", "cache of the kernel package and of recent boot parts (default $CAIRN_CACHE or ~/.cache/cairn)")
	b.Flags().BoolVar(&o.NoCache, "no-cache", false, "build the UKI and EFI system partition anew, without the cache")
	b.Flags().StringVar((*string)(&o.SecureBoot), "secure-boot", "", "directory of Secure Boot keys (config gen --secure-boot): sign systemd-boot and the UKI, and have the firmware enroll the keys at first boot")
	b.Flags().StringVar(&size, "size", "", "disk size, e.g. 8GiB (default 2GiB)")
	b.MarkFlagRequired("output")
	cmd.AddCommand(b, pushCmd(), cidataCmd())
	return cmd
}

// pushCmd is cairn image push: a UKI to a registry, as an OCI artifact.
func pushCmd() *cobra.Command {
	var uki string
	var insecure bool
	p := &cobra.Command{
		Use:   "push --uki UKI REF",
		Short: "Push a UKI (cairn image build --uki) to a registry, for cairn node upgrade --image-ref",
		Long: `Push sends the UKI to a registry as an OCI artifact REF: one layer of
media type ` + bootentry.MediaType + `, annotated with the UKI's version.
A node then pulls it with its own containerd, through the registry hosts of
its containerd.registries, with cairn node upgrade --image-ref REF.
Credentials come from the Docker config (~/.docker/config.json).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if uki == "" {
				return errors.New("name the UKI with --uki FILE (cairn image build --uki writes one)")
			}
			digest, err := oci.PushUKI(cmd.Context(), uki, args[0], insecure)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "pushed %s as %s@%s\nnext: cairn node upgrade --image-ref %s\n", uki, args[0], digest, args[0])
			return nil
		},
	}
	p.Flags().StringVar(&uki, "uki", "", "the UKI to push (required)")
	p.Flags().BoolVar(&insecure, "insecure", false, "the registry serves plain HTTP")
	return p
}

// cidataCmd is cairn image cidata: a NoCloud volume holding a machine
// config, for a generic image's first boot.
func cidataCmd() *cobra.Command {
	var config, out string
	c := &cobra.Command{
		Use:   "cidata -c MACHINE.yaml -o CIDATA.img",
		Short: "Write a NoCloud volume (vfat, labelled CIDATA) holding a machine config, for a generic image's first boot",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			data, err := os.ReadFile(config)
			if err != nil {
				return fmt.Errorf("machine config: %w (`cairn config gen` writes one)", err)
			}
			cfg, err := staticpod.Parse(data)
			if err != nil {
				return fmt.Errorf("%s: %w", config, err)
			}
			epoch, err := sourceDateEpoch()
			if err != nil {
				return err
			}
			if epoch == 0 {
				epoch = build.DefaultSourceDateEpoch
			}
			host := cfg.Machine.Hostname
			meta := fmt.Sprintf("instance-id: %s\nlocal-hostname: %s\n", host, host)
			if err := image.WriteNoCloud(cmd.Context(), image.NoCloud{UserData: data, MetaData: []byte(meta), SourceDateEpoch: epoch}, out); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %s\nnext: attach it to a machine booting a generic image (cairn image build --generic)\n", out)
			return nil
		},
	}
	c.Flags().StringVarP(&config, "config", "c", "", "machine config (required)")
	c.Flags().StringVarP(&out, "output", "o", "", "volume to write (required)")
	c.MarkFlagRequired("config")
	c.MarkFlagRequired("output")
	return c
}

// btoi is 1 for true.
func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
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
