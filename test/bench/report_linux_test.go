//go:build bench

package bench

import (
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"text/tabwriter"
	"time"
)

// Goals for cairn-agent (issue 9).
const (
	goalLatency = 1.10 // cairn-agent/cri-floor, p50 and p99
	goalCPU     = 0.30 // cairn-agent/kubelet, CPU-seconds of the concurrent run
	goalRSS     = 60   // MiB, cairn-agent with podCount pods running
)

// report prints the figures as tables, the processes they are of, and the
// main ones as the benchmark's metrics.
func report(b *testing.B, containerd int, floor, agent, podAgent, kubelet nodeFigures) {
	floor.name = "cri-floor"
	printReport(os.Stdout, containerd, floor, agent, podAgent, kubelet)

	b.ReportMetric(percentile(agent.seq, 50).Seconds()/percentile(floor.seq, 50).Seconds(), "cairn-agent/floor-seq-p50")
	b.ReportMetric(percentile(agent.conc, 99).Seconds(), "cairn-agent-conc-p99-s")
	b.ReportMetric(percentile(podAgent.conc, 99).Seconds(), "podagent-conc-p99-s")
	b.ReportMetric(percentile(kubelet.conc, 99).Seconds(), "kubelet-conc-p99-s")
	b.ReportMetric(agent.cpu.Seconds()/kubelet.cpu.Seconds(), "cairn-agent/kubelet-cpu")
	b.ReportMetric(podAgent.cpu.Seconds()/kubelet.cpu.Seconds(), "podagent/kubelet-cpu")
	b.ReportMetric(mib(agent.rss), "cairn-agent-rss-MiB")
	b.ReportMetric(mib(podAgent.rss), "podagent-rss-MiB")
}

func printReport(out io.Writer, containerd int, floor, agent, podAgent, kubelet nodeFigures) {
	fmt.Fprintf(out, `
pod startup of %d pods, one after another (seq) and all at once (conc): from the Pod's creation to its phase Running seen
through a watch; for cri-floor, RunPodSandbox + CreateContainer + StartContainer straight through the CRI, no node process.
Nearest-rank percentiles. all-ready: first creation to last pod Ready in the concurrent run.
cpu-s conc: CPU-seconds (user + system, /proc/PID/stat) of the node process over the concurrent run; idle: over %v with
the %d pods running; rss and peak: VmRSS and VmHWM (/proc/PID/status) with them running; containerd and host: CPU-seconds
of containerd (PID %d) and of the whole host, busy of what its CPUs had, over the concurrent run.

`, podCount, settle, podCount, containerd)
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "contender\tpid\tseq p50\tseq p90\tseq p99\tconc p50\tconc p90\tconc p99\tall-ready\tcpu-s conc\tcpu-s idle\trss MiB\tpeak MiB\tcontainerd cpu-s\thost cpu-s busy/total")
	for _, f := range []nodeFigures{floor, agent, podAgent, kubelet} {
		pid, cpu, idle, rss, peak := "-", "-", "-", "-", "-"
		if f.pid != 0 {
			pid = fmt.Sprint(f.pid)
			cpu, idle = fmt.Sprintf("%.2f", f.cpu.Seconds()), fmt.Sprintf("%.2f", f.idleCPU.Seconds())
			rss, peak = fmt.Sprintf("%.1f", mib(f.rss)), fmt.Sprintf("%.1f", mib(f.peakRSS))
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.2f\t%.2f/%.2f\n", f.name, pid,
			seconds(percentile(f.seq, 50)), seconds(percentile(f.seq, 90)), seconds(percentile(f.seq, 99)),
			seconds(percentile(f.conc, 50)), seconds(percentile(f.conc, 90)), seconds(percentile(f.conc, 99)),
			seconds(f.concWall), cpu, idle, rss, peak,
			f.containerdCPU.Seconds(), f.hostBusy.Seconds(), f.hostTotal.Seconds())
	}
	w.Flush()
	fmt.Fprintln(out)
	fmt.Fprintln(w, "ratio\tseq p50\tseq p90\tseq p99\tconc p50\tconc p90\tconc p99\tall-ready\tcpu-s conc\tcpu-s idle\trss")
	for _, r := range [][2]nodeFigures{{agent, floor}, {agent, kubelet}, {agent, podAgent}, {podAgent, floor}, {podAgent, kubelet}} {
		a, d := r[0], r[1]
		lat := func(ds func(nodeFigures) []time.Duration, p float64) string {
			return ratio(percentile(ds(a), p), percentile(ds(d), p))
		}
		cpu, idle, rss := "-", "-", "-"
		if d.pid != 0 {
			cpu, idle, rss = ratio(a.cpu, d.cpu), ratio(a.idleCPU, d.idleCPU), ratio(time.Duration(a.rss), time.Duration(d.rss))
		}
		fmt.Fprintf(w, "%s/%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", a.name, d.name,
			lat(seqOf, 50), lat(seqOf, 90), lat(seqOf, 99), lat(concOf, 50), lat(concOf, 90), lat(concOf, 99),
			ratio(a.concWall, d.concWall), cpu, idle, rss)
	}
	w.Flush()

	fmt.Fprintf(out, "\ngoals for cairn-agent: cairn-agent/cri-floor p50 and p99 <= %.2f: seq %s %s, conc %s %s; cairn-agent/kubelet cpu-s conc <= %.2f: %s; rss <= %d MiB: %.1f MiB (%s)\n",
		goalLatency,
		ratio(percentile(agent.seq, 50), percentile(floor.seq, 50)), ratio(percentile(agent.seq, 99), percentile(floor.seq, 99)),
		ratio(percentile(agent.conc, 50), percentile(floor.conc, 50)), ratio(percentile(agent.conc, 99), percentile(floor.conc, 99)),
		goalCPU, ratio(agent.cpu, kubelet.cpu), goalRSS, mib(agent.rss), metOrMissed(agent, floor, kubelet))

	fmt.Fprintf(out, "\nthe processes measured, each PID's command line (/proc/PID/cmdline) when its memory was read:\n")
	for _, f := range []nodeFigures{agent, podAgent, kubelet} {
		fmt.Fprintf(out, "%-11s PID %d: %s\n", f.name, f.pid, f.command)
		if f.summary != "" {
			fmt.Fprintf(out, "%-11s %s\n", "", f.summary)
		}
	}
	cmd, err := pidCommand(containerd)
	if err != nil {
		cmd = err.Error()
	}
	fmt.Fprintf(out, "%-11s PID %d: %s\n", "containerd", containerd, cmd)
	fmt.Fprintln(out, "cairn-agent is the binary of ./agent with its management API, metrics and Service proxier; podagent is its kubelet part alone")
	fmt.Fprintln(out, "(test/bench/cmd/podagent); the kubelet was started through unshare and sh, which exec it, so its PID is the kubelet's.")
}

func seqOf(f nodeFigures) []time.Duration  { return f.seq }
func concOf(f nodeFigures) []time.Duration { return f.conc }

// ratio is a/b with two decimals, or "-" when b is zero.
func ratio(a, b time.Duration) string {
	if b == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", float64(a)/float64(b))
}

// metOrMissed names the goals that cairn-agent missed, or says all are met.
func metOrMissed(agent, floor, kubelet nodeFigures) string {
	var missed []string
	for _, c := range []struct {
		name     string
		got, max float64
	}{
		{"seq p50", percentile(agent.seq, 50).Seconds() / percentile(floor.seq, 50).Seconds(), goalLatency},
		{"seq p99", percentile(agent.seq, 99).Seconds() / percentile(floor.seq, 99).Seconds(), goalLatency},
		{"conc p50", percentile(agent.conc, 50).Seconds() / percentile(floor.conc, 50).Seconds(), goalLatency},
		{"conc p99", percentile(agent.conc, 99).Seconds() / percentile(floor.conc, 99).Seconds(), goalLatency},
		{"cpu", agent.cpu.Seconds() / kubelet.cpu.Seconds(), goalCPU},
		{"rss", mib(agent.rss), goalRSS},
	} {
		if !(c.got <= c.max) {
			missed = append(missed, c.name)
		}
	}
	if len(missed) == 0 {
		return "all met"
	}
	return "missed: " + strings.Join(missed, ", ")
}
