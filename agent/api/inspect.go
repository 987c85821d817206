package api

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/cairn-os/cairn/api/machine"
	"github.com/moby/sys/mountinfo"
	"github.com/prometheus/procfs"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// kmsgPath is the kernel log's device; kmsgPoll bounds how long a followed
// read waits before it looks at the call's context again.
const (
	kmsgPath = "/dev/kmsg"
	kmsgPoll = 250 * time.Millisecond
)

// Dmesg reads /dev/kmsg, one record per read(2), from the oldest record
// the kernel keeps.
func (s *machineServer) Dmesg(req *machine.DmesgRequest, stream grpc.ServerStreamingServer[machine.DmesgRecord]) error {
	// Non-blocking, so that the end of the buffer shows as EAGAIN.
	fd, err := unix.Open(kmsgPath, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return status.Errorf(codes.Unavailable, "open %s: %v", kmsgPath, err)
	}
	defer unix.Close(fd)
	buf := make([]byte, 8192) // a record's most, with its dictionary
	ctx := stream.Context()
	for {
		n, err := unix.Read(fd, buf)
		switch {
		case err == unix.EPIPE:
			continue // records were overwritten before we read them: go on with the next
		case err == unix.EAGAIN:
			if !req.Follow {
				return nil
			}
			if err := waitReadable(ctx, fd); err != nil {
				return err
			}
			continue
		case err != nil:
			return status.Errorf(codes.Internal, "read %s: %v", kmsgPath, err)
		}
		rec, err := parseKmsg(buf[:n])
		if err != nil {
			return status.Errorf(codes.Internal, "%s: %v", kmsgPath, err)
		}
		if err := stream.Send(rec); err != nil {
			return err
		}
	}
}

// waitReadable waits until fd has data or ctx ends.
func waitReadable(ctx context.Context, fd int) error {
	for {
		if err := ctx.Err(); err != nil {
			return status.FromContextError(err).Err()
		}
		n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, int(kmsgPoll/time.Millisecond))
		if err == unix.EINTR || (err == nil && n == 0) {
			continue
		}
		if err != nil {
			return status.Errorf(codes.Internal, "poll %s: %v", kmsgPath, err)
		}
		return nil
	}
}

// parseKmsg parses one record of /dev/kmsg: "PRIO,SEQ,USEC,FLAGS;MESSAGE\n"
// followed by " KEY=VALUE" dictionary lines, which are left out (see the
// kernel's Documentation/ABI/testing/dev-kmsg).
func parseKmsg(raw []byte) (*machine.DmesgRecord, error) {
	head, rest, ok := bytes.Cut(raw, []byte{';'})
	if !ok {
		return nil, fmt.Errorf("record %q has no ';'", raw)
	}
	msg, _, _ := bytes.Cut(rest, []byte{'\n'})
	fields := strings.Split(string(head), ",")
	if len(fields) < 3 {
		return nil, fmt.Errorf("record header %q has fewer than 3 fields", head)
	}
	prio, err1 := strconv.ParseUint(fields[0], 10, 32)
	seq, err2 := strconv.ParseUint(fields[1], 10, 64)
	usec, err3 := strconv.ParseUint(fields[2], 10, 64)
	if err := errors.Join(err1, err2, err3); err != nil {
		return nil, fmt.Errorf("record header %q: %w", head, err)
	}
	return &machine.DmesgRecord{
		Level:    int32(prio & 7),
		Facility: int32(prio >> 3),
		Sequence: seq,
		Time:     durationpb.New(time.Duration(usec) * time.Microsecond),
		Message:  string(msg),
	}, nil
}

// Mounts lists the agent's mount table: on a node, the host's.
func (s *machineServer) Mounts(context.Context, *machine.MountsRequest) (*machine.MountsResponse, error) {
	infos, err := mountinfo.GetMounts(nil)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "read mountinfo: %v", err)
	}
	resp := &machine.MountsResponse{}
	for _, m := range infos {
		resp.Mounts = append(resp.Mounts, &machine.Mount{Source: m.Source, Target: m.Mountpoint, Type: m.FSType, Options: m.Options, SuperOptions: m.VFSOptions})
	}
	return resp, nil
}

// procRoot is where procfs is mounted.
const procRoot = "/proc"

// Processes lists every process in /proc. One that ends while it is being
// read is left out.
func (s *machineServer) Processes(context.Context, *machine.ProcessesRequest) (*machine.ProcessesResponse, error) {
	fs, err := procfs.NewFS(procRoot)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "open %s: %v", procRoot, err)
	}
	procs, err := fs.AllProcs()
	if err != nil {
		return nil, status.Errorf(codes.Internal, "list processes: %v", err)
	}
	resp := &machine.ProcessesResponse{}
	for _, p := range procs {
		st, err := p.Stat()
		if err != nil {
			continue // it ended
		}
		proc := &machine.Process{
			Pid:     int32(st.PID),
			Parent:  int32(st.PPID),
			State:   st.State,
			CpuTime: durationpb.New(time.Duration(st.CPUTime() * float64(time.Second))),
			Rss:     uint64(st.ResidentMemory()),
		}
		if args, err := p.CmdLine(); err == nil && len(args) > 0 {
			proc.Command = strings.Join(args, " ")
		} else {
			proc.Command = "[" + st.Comm + "]" // a kernel thread has no arguments
		}
		if cgs, err := p.Cgroups(); err == nil {
			for _, cg := range cgs {
				if cg.HierarchyID == 0 { // cgroup v2's single hierarchy
					proc.Cgroup = cg.Path
				}
			}
		}
		resp.Processes = append(resp.Processes, proc)
	}
	return resp, nil
}
