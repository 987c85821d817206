package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/cairn-os/cairn/api/client"
	"github.com/cairn-os/cairn/api/machine"
	"github.com/cairn-os/cairn/internal/bootentry"
)

// upgradeCmds are cairn node upgrade, rollback and reset.
func upgradeCmds(f *nodeFlags) []*cobra.Command {
	var (
		uki           string
		stage         bool
		tries         uint32
		healthTimeout time.Duration
		wait          time.Duration
		maxParallel   int
		noDrain       bool
		drainFlags    drainOptions
		imageRef      string
	)
	upgrade := &cobra.Command{
		Use:   "upgrade --image UKI [--stage] [--max-parallel N]",
		Short: "Upgrade the node to a UKI (cairn image build --uki), rolled back by itself unless healthy",
		Long: `Upgrade sends a UKI to the node, which checks its size, digest and version
and writes it to its EFI system partition beside the running one, on trial,
then reboots into it. The new UKI's boot blesses it once containerd and
cairn-agent are Ready within --health-timeout; after --tries boots that are
not, the node boots the previous UKI again and says why in 'cairn node
version'. The command follows the node until the new version is blessed
(or rolled back), for at most --wait.

In a cluster, the node drains itself between the checks and the write, as
kubectl drain does with its own credentials: its Node cordoned, its pods
but DaemonSet and static pods evicted (PodDisruptionBudgets respected).
If they are not gone within --drain-timeout, the upgrade is refused and
the Node uncordoned, unless --force deletes them. The node uncordons its
Node once Ready after the reboot. --no-drain skips it; --stage does not
drain (the reboot comes later).

With --nodes, --max-parallel N upgrades N nodes at a time and stops at the
first wave with a node that did not come back healthy.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if (uki == "") == (imageRef == "") {
				return errors.New("name the UKI with --image FILE (cairn image build --uki writes one), or an artifact in a registry with --image-ref REF (cairn image push)")
			}
			version := "" // an artifact's: as the node reads it
			if uki != "" {
				info, err := readUKI(uki)
				if err != nil {
					return err
				}
				version = info.Version
			}
			d := drainFlags.message()
			d.Skip = noDrain
			h := &machine.UpgradeHeader{Stage: stage, Tries: tries, HealthTimeout: durationpb.New(healthTimeout), Drain: d, ImageRef: imageRef}
			return f.inWaves(cmd, maxParallel, wait, func(ctx context.Context, n *target) error {
				return upgradeNode(ctx, n, uki, version, h)
			})
		},
	}
	upgrade.Flags().StringVar(&uki, "image", "", "the UKI to boot (cairn image build --uki)")
	upgrade.Flags().StringVar(&imageRef, "image-ref", "", "the UKI as an artifact in a registry (cairn image push), pulled by the node's containerd")
	upgrade.Flags().BoolVar(&stage, "stage", false, "write it now, boot it at the next reboot")
	upgrade.Flags().Uint32Var(&tries, "tries", bootentry.DefaultTries, "boots the new UKI gets to become healthy")
	upgrade.Flags().DurationVar(&healthTimeout, "health-timeout", 5*time.Minute, "how long each of its boots has to become healthy")
	upgrade.Flags().DurationVar(&wait, "wait", 30*time.Minute, "how long to follow each node until its new version is blessed")
	upgrade.Flags().IntVar(&maxParallel, "max-parallel", 0, "with --nodes: upgrade this many nodes at a time (0: all)")
	upgrade.Flags().BoolVar(&noDrain, "no-drain", false, "do not drain the node before its reboot")
	drainFlags.add(upgrade)

	rollback := f.call("rollback", "Boot the other UKI now and from then on (the one before the last upgrade)", func(ctx context.Context, c *client.Client, w io.Writer) error {
		resp, err := c.Rollback(ctx, &machine.RollbackRequest{})
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(w, "rebooting from %s into %s\n", resp.From, resp.To)
		return err
	})
	var wipeState, powerOff, graceful bool
	var resetDrain drainOptions
	reset := f.call("reset [--graceful] [--wipe-state] [--shutdown]", "Wipe EPHEMERAL (containers, images, logs), and with --wipe-state STATE too, then reboot (admin)", func(ctx context.Context, c *client.Client, w io.Writer) error {
		resp, err := c.Reset(ctx, &machine.ResetRequest{WipeState: wipeState, Shutdown: powerOff, Graceful: graceful, Drain: resetDrain.message()})
		if err != nil {
			return err
		}
		_, err = fmt.Fprintln(w, resp.Outcome)
		return err
	})
	reset.Long = `Reset stops the node and wipes EPHEMERAL: containerd's images and
containers, the pods' and services' logs, the kubelet's state. The next boot
makes it anew, as at first boot. With --wipe-state it also wipes STATE (the
configs applied since, the upgrade record): the node boots as its image made
it, on the machine config it came with. The UKIs stay. Then the node
reboots, or with --shutdown powers off. Needs the admin role.

With --graceful the node drains first, as an upgrade does (--drain-timeout,
--force), and deletes its Node if the cluster lets it; most clusters do not
let a node delete its own Node, and the outcome then says so.`
	reset.Flags().BoolVar(&wipeState, "wipe-state", false, "also wipe STATE: boot on the image's first-boot config")
	reset.Flags().BoolVar(&powerOff, "shutdown", false, "power off once wiped instead of rebooting")
	reset.Flags().BoolVar(&graceful, "graceful", false, "drain the node and delete its Node first")
	resetDrain.add(reset)
	return []*cobra.Command{upgrade, rollback, reset}
}

// drainOptions are the flags of a drain.
type drainOptions struct {
	timeout time.Duration
	force   bool
}

func (d *drainOptions) add(cmd *cobra.Command) {
	cmd.Flags().DurationVar(&d.timeout, "drain-timeout", 5*time.Minute, "how long the node's pods have to go")
	cmd.Flags().BoolVar(&d.force, "force", false, "past --drain-timeout, delete the pods still there (PodDisruptionBudgets or not)")
}

func (d *drainOptions) message() *machine.DrainOptions {
	return &machine.DrainOptions{Timeout: durationpb.New(d.timeout), Force: d.force}
}

// readUKI checks the file is a Cairn UKI before anything is sent.
func readUKI(path string) (bootentry.Info, error) {
	f, err := os.Open(path)
	if err != nil {
		return bootentry.Info{}, err
	}
	defer f.Close()
	info, err := bootentry.ReadUKI(f)
	if err != nil {
		return info, fmt.Errorf("%s: %w", path, err)
	}
	return info, nil
}

// upgradeNode sends the UKI and, unless staged, follows the node through
// its reboot until it runs the new version blessed, or went back.
func upgradeNode(ctx context.Context, n *target, uki, version string, h *machine.UpgradeHeader) error {
	stream, err := n.Client.Upgrade(ctx)
	if err != nil {
		return err
	}
	start := time.Now()
	var rebooting bool
	progress := func(p *machine.UpgradeProgress) {
		fmt.Fprintf(n.Out, "%-9s %s\n", p.Step, p.Message)
		rebooting = rebooting || p.Step == "rebooting"
		if version == "" {
			version = p.Version // the artifact's, once the node read it
		}
	}
	header := &machine.UpgradeHeader{Stage: h.Stage, Tries: h.Tries, HealthTimeout: h.HealthTimeout, Drain: h.Drain, ImageRef: h.ImageRef}
	if h.ImageRef != "" {
		_, err = client.SendRef(stream, header, progress)
	} else {
		_, err = client.SendUKI(stream, uki, header, progress)
	}
	if err != nil && !rebooting { // once rebooting, the node may go before the call ends
		return err
	}
	if !rebooting {
		return nil // staged
	}
	seen := ""
	return followUpgrade(ctx, n, version, func(v *machine.VersionResponse) (bool, error) {
		switch {
		case v.CairnVersion == version && seen != "healthy":
			seen = "healthy"
			fmt.Fprintf(n.Out, "%-9s %s serves the API, %s after the call\n", "healthy", version, time.Since(start).Round(time.Second))
		case v.Boot.GetRolledBackFrom() == version:
			return true, fmt.Errorf("rolled back to %s: %s", v.CairnVersion, v.Boot.GetRollbackReason())
		}
		if v.CairnVersion == version && v.Boot.GetBlessed() {
			fmt.Fprintf(n.Out, "%-9s %s (%s), %s after the call\n", "blessed", v.Boot.Entry, version, time.Since(start).Round(time.Second))
			return true, nil
		}
		return false, nil
	})
}

// followUpgrade polls the node's Version, each call bounded (the node
// goes away while it reboots), until done says it is over, or ctx ends.
func followUpgrade(ctx context.Context, n *target, version string, done func(*machine.VersionResponse) (bool, error)) error {
	var last error
	for {
		callCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		v, err := n.Client.Version(callCtx, &machine.VersionRequest{})
		cancel()
		if err == nil {
			if over, err := done(v); over {
				return err
			}
		} else {
			last = err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the node did not run %s blessed in time (last error: %v): see `cairn node version`", version, last)
		case <-time.After(2 * time.Second):
		}
	}
}

// bootState is Version's line about the node's UKIs.
func bootState(b *machine.BootState) string {
	s := b.Entry
	if b.Blessed {
		s += " (blessed)"
	}
	if b.SecureBoot {
		s += "; Secure Boot enforced"
	}
	if b.Other != "" {
		s += "; other: " + b.Other
	}
	if b.Pending != "" {
		s += "; " + b.Pending
	}
	if b.RolledBackFrom != "" {
		s += fmt.Sprintf("; rolled back from %s: %s", b.RolledBackFrom, b.RollbackReason)
	}
	if b.Error != "" {
		s += "; error: " + b.Error
	}
	return s
}
