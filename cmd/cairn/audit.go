package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/cairn-os/cairn/api/machine"
)

func auditCmd(f *nodeFlags) *cobra.Command {
	var limit int
	cmd := &cobra.Command{
		Use:   "audit",
		Short: "Show who called what that changes the node, refused calls included (operator role)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return f.onNodes(cmd, callTimeout, func(ctx context.Context, n *target) error {
				resp, err := n.Client.Audit(ctx, &machine.AuditRequest{Limit: int32(limit)})
				if err != nil {
					return err
				}
				return printAudit(n.Out, resp.Records)
			})
		},
	}
	cmd.Flags().IntVar(&limit, "limit", 0, "the latest records only (0: all the node keeps)")
	return cmd
}

func printAudit(w io.Writer, records []*machine.AuditRecord) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TIME\tCALLER\tROLE\tPEER\tCALL\tREQUEST\tRESULT\tDURATION")
	for _, r := range records {
		var req []string
		for _, k := range slices.Sorted(maps.Keys(r.Request)) {
			req = append(req, k+"="+r.Request[k])
		}
		if len(req) == 0 {
			req = []string{"-"}
		}
		result := r.Code
		if r.Error != "" {
			result += ": " + r.Error
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Time.AsTime().Format(time.RFC3339), r.Caller, r.Role, r.Peer, r.Method,
			strings.Join(req, " "), result, r.Duration.AsDuration().Round(time.Microsecond))
	}
	return tw.Flush()
}
