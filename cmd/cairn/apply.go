package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/cairn-os/cairn/api/client"
	"github.com/cairn-os/cairn/api/machine"
)

// applyModes are the --mode values of cairn node apply.
var applyModes = map[string]machine.ApplyMode{
	"auto":      machine.ApplyMode_APPLY_MODE_AUTO,
	"no-reboot": machine.ApplyMode_APPLY_MODE_NO_REBOOT,
	"reboot":    machine.ApplyMode_APPLY_MODE_REBOOT,
	"staged":    machine.ApplyMode_APPLY_MODE_STAGED,
	"try":       machine.ApplyMode_APPLY_MODE_TRY,
	"dry-run":   machine.ApplyMode_APPLY_MODE_DRY_RUN,
}

// applyCmds are cairn node apply and confirm.
func applyCmds(f *nodeFlags) []*cobra.Command {
	var file, mode, fingerprint string
	var timeout time.Duration
	var insecure bool
	apply := &cobra.Command{
		Use:   "apply -f FILE [--mode auto|no-reboot|reboot|staged|try|dry-run]",
		Short: "Apply a machine config to the node: live where it can, else at a reboot",
		Long: `Apply sends a machine config to the node, which checks it and compares it
with the config it runs. Each change is printed with when it takes effect
(live, or at the next boot), then what the node did. Modes:

  auto       live if every change is live, else written and the node rebooted
  no-reboot  live; refused if a change needs a reboot
  reboot     written, then the node reboots
  staged     written, used from the next boot
  try        live for --timeout, then reverted unless 'cairn node confirm'
  dry-run    nothing changed: only the changes are printed

An invalid config, or one its mode cannot apply, changes nothing.

A node in maintenance mode (it found no config at its first boot) takes
its first config with --insecure --fingerprint FP -n IP:PORT, FP being
what its console prints: it has no certificate of your CA yet.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			m, ok := applyModes[mode]
			if !ok {
				return fmt.Errorf("--mode %q: use one of auto, no-reboot, reboot, staged, try, dry-run", mode)
			}
			if file == "" {
				return fmt.Errorf("name the machine config with -f FILE")
			}
			doc, err := os.ReadFile(file)
			if err != nil {
				return err
			}
			req := &machine.ApplyConfigRequest{Config: doc, Mode: m}
			if m == machine.ApplyMode_APPLY_MODE_TRY {
				req.TryTimeout = durationpb.New(timeout)
			}
			if insecure {
				return applyInsecure(cmd, f.nodes, fingerprint, req)
			}
			return f.onNodes(cmd, callTimeout, func(ctx context.Context, n *target) error {
				resp, err := n.Client.ApplyConfig(ctx, req)
				if err != nil {
					return err
				}
				printApply(n.Out, resp)
				return nil
			})
		},
	}
	apply.Flags().StringVarP(&file, "file", "f", "", "the machine config (YAML)")
	apply.Flags().StringVar(&mode, "mode", "auto", "auto, no-reboot, reboot, staged, try or dry-run")
	apply.Flags().DurationVar(&timeout, "timeout", time.Minute, "with --mode try: how long until the config is reverted unless confirmed")
	apply.Flags().BoolVar(&insecure, "insecure", false, "to a node in maintenance mode: no client certificate, the node trusted by --fingerprint")
	apply.Flags().StringVar(&fingerprint, "fingerprint", "", "with --insecure: the fingerprint of the node's certificate, from its console")
	confirm := f.call("confirm", "Keep the config being tried (apply --mode try): written to STATE, used at every boot", func(ctx context.Context, c *client.Client, w io.Writer) error {
		resp, err := c.ConfirmConfig(ctx, &machine.ConfirmConfigRequest{})
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(w, "generation %d confirmed\n", resp.Generation)
		return err
	})
	return []*cobra.Command{apply, confirm}
}

// applyInsecure applies req to the one node of nodes, in maintenance
// mode, trusted by its certificate's fingerprint.
func applyInsecure(cmd *cobra.Command, nodes []string, fingerprint string, req *machine.ApplyConfigRequest) error {
	if len(nodes) != 1 || fingerprint == "" {
		return errors.New("--insecure applies to one node in maintenance mode: name it with -n IP:PORT and its certificate with --fingerprint (its console prints both)")
	}
	c, err := client.DialFingerprint(nodes[0], fingerprint)
	if err != nil {
		return err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(cmd.Context(), callTimeout)
	defer cancel()
	resp, err := c.ApplyConfig(ctx, req)
	if err != nil {
		return fmt.Errorf("%s: %w", nodes[0], err)
	}
	printApply(cmd.OutOrStdout(), resp)
	return nil
}

// printApply prints each change with when it takes effect, then what the
// node did.
func printApply(w io.Writer, resp *machine.ApplyConfigResponse) {
	for _, c := range resp.Changes {
		when := "live"
		if c.Reboot {
			when = "reboot"
		}
		fmt.Fprintf(w, "%-7s %s\n", when, c.Text)
	}
	fmt.Fprintf(w, "generation %d: %s\n", resp.Generation, resp.Outcome)
}

// configState is Version's line about the machine config.
func configState(c *machine.ConfigState) string {
	s := fmt.Sprintf("generation %d", c.Generation)
	var notes []string
	if c.BootGeneration != c.Generation && c.TryUntil == nil {
		notes = append(notes, fmt.Sprintf("generation %d staged for the next boot", c.BootGeneration))
	}
	if c.TryUntil != nil {
		notes = append(notes, fmt.Sprintf("being tried until %s: cairn node confirm keeps it, else generation %d comes back",
			c.TryUntil.AsTime().Local().Format(time.RFC3339), c.BootGeneration))
	}
	if c.OnTrial {
		notes = append(notes, "on trial: kept once containerd and cairn-agent are Ready, else the previous config comes back at a reboot")
	}
	if c.LastError != "" {
		notes = append(notes, c.LastError)
	}
	if len(notes) > 0 {
		s += "; " + strings.Join(notes, "; ")
	}
	return s
}
