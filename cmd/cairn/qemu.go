package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/cairn-os/cairn/api/client"
	"github.com/cairn-os/cairn/api/machine"
	"github.com/cairn-os/cairn/machineconfig"
	"github.com/cairn-os/cairn/qemu"
	"github.com/spf13/cobra"
)

func qemuCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "qemu", Short: "Boot images in QEMU"}
	var o qemu.Options
	var cairnconfig string
	var timeout time.Duration
	var diskSize string
	run := &cobra.Command{
		Use:   "run DISK",
		Short: "Boot a disk image, wait for its API, and shut it down cleanly on Ctrl-C",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Disk = args[0]
			if o.CDROM != "" {
				if err := emptyDisk(o.Disk, diskSize); err != nil {
					return err
				}
			}
			cc, err := machineconfig.LoadClientConfig(cairnconfig)
			if err != nil {
				return fmt.Errorf("%w (the API is probed with it: pass --cairnconfig)", err)
			}
			endpoint := fmt.Sprintf("127.0.0.1:%d", o.APIPort)
			c, err := client.Dial(cc, endpoint)
			if err != nil {
				return err
			}
			defer c.Close()
			return runVM(cmd.Context(), o, c, endpoint, cairnconfig, timeout)
		},
	}
	run.Flags().IntVar(&o.APIPort, "api-port", machineconfig.DefaultAPIPort, "port on 127.0.0.1 forwarded to the node's API")
	run.Flags().IntVar(&o.MetricsPort, "metrics-port", machineconfig.DefaultMetricsPort, "port on 127.0.0.1 forwarded to the node's metrics (0: none)")
	run.Flags().StringSliceVar(&o.Attach, "attach", nil, "raw image to attach read-only as another disk, e.g. a NoCloud volume (cairn image cidata); repeatable")
	run.Flags().StringVar(&o.CDROM, "cdrom", "", "ISO to put in a CD-ROM drive (image build --format iso): it installs onto DISK, made empty if missing, then the VM boots DISK")
	run.Flags().StringVar(&diskSize, "disk-size", "4Gi", "size of the empty DISK that --cdrom makes")
	run.Flags().BoolVar(&o.SecureBoot, "secure-boot", false, "boot OVMF's Secure Boot firmware: a new variable store enrolls the keys of an image built with --secure-boot, then boots only what they signed")
	run.Flags().IntVar(&o.MemoryMiB, "memory", 2048, "memory in MiB")
	run.Flags().IntVar(&o.CPUs, "cpus", 2, "virtual CPUs")
	run.Flags().StringVar(&o.Accel, "accel", qemu.DefaultAccel(), "accelerator: auto (KVM if it really runs the guest, else TCG), kvm or tcg; default from $"+qemu.EnvAccel)
	run.Flags().StringVar(&cairnconfig, "cairnconfig", defaultClientConfig(), "client config used to probe the API")
	run.Flags().DurationVar(&timeout, "timeout", 5*time.Minute, "how long to wait for the API")
	cmd.AddCommand(run, qemuClusterCmd())
	return cmd
}

func runVM(ctx context.Context, o qemu.Options, c *client.Client, endpoint, cairnconfig string, timeout time.Duration) error {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)

	o.Notify = func(line string) { fmt.Println(line) }
	vm, err := qemu.Start(o)
	if err != nil {
		return err
	}
	fmt.Printf("booting %s (accel %s, console log %s)\n", o.Disk, vm.Accel(), vm.Opts.ConsoleLog)
	readyCtx, cancel := context.WithTimeout(ctx, timeout)
	go func() {
		select {
		case <-sigs:
			cancel()
		case <-readyCtx.Done():
		}
	}()
	lastReport := time.Duration(0)
	err = vm.WaitReady(readyCtx, "the node's API on "+endpoint, func(ctx context.Context) error {
		_, err := c.Version(ctx, &machine.VersionRequest{})
		return err
	}, func(elapsed time.Duration, line string) {
		if elapsed-lastReport >= 5*time.Second {
			lastReport = elapsed
			fmt.Printf("  %3.0fs  %s\n", elapsed.Seconds(), line)
		}
	})
	cancel()
	if err != nil {
		vm.Kill()
		return err
	}
	fmt.Printf("node ready: its API answers on %s\n  cairn node --cairnconfig %s --nodes %s version\nCtrl-C shuts it down.\n", endpoint, cairnconfig, endpoint)

	select {
	case <-vm.Done():
		fmt.Println("node stopped")
		return vm.Wait()
	case <-sigs:
	}
	fmt.Println("shutting the node down")
	sctx, scancel := context.WithTimeout(ctx, 10*time.Second)
	_, err = c.Shutdown(sctx, &machine.ShutdownRequest{})
	scancel()
	if err != nil {
		fmt.Printf("shutdown through the API failed (%v); stopping QEMU\n", err)
		vm.Kill()
		return nil
	}
	select {
	case <-vm.Done():
		fmt.Println("node powered off")
		return vm.Wait()
	case <-time.After(90 * time.Second):
		fmt.Println("node did not power off in 90s; stopping QEMU")
		vm.Kill()
		return nil
	}
}

// emptyDisk makes the raw disk path, empty and sparse, of size (a
// quantity such as 8Gi), unless it exists.
func emptyDisk(path, size string) error {
	n, err := machineconfig.Quantity(size).Bytes()
	if err != nil {
		return fmt.Errorf("--disk-size: %w", err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if errors.Is(err, fs.ErrExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := f.Truncate(n / 512 * 512); err != nil {
		f.Close()
		return err
	}
	fmt.Printf("made the empty disk %s of %s to install onto\n", path, size)
	return f.Close()
}
