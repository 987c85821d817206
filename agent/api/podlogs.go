package api

import (
	"bytes"
	"errors"
	"io"
	"os"
	"time"

	"github.com/cairn-os/cairn/api/machine"
	"github.com/cairn-os/cairn/internal/crilog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Pod logs are sent in chunks of whole lines of about this size, and a
// followed log is read again this often once its end is reached.
const (
	podLogChunk = 32 << 10
	podLogPoll  = 250 * time.Millisecond
)

// PodLogs sends the lines of a pod container's CRI log under the pod log
// root, as the container printed them.
func (s *machineServer) PodLogs(req *machine.PodLogsRequest, stream grpc.ServerStreamingServer[machine.LogsChunk]) error {
	path, err := crilog.Find(s.podLogRoot, req.Namespace, req.Pod, req.Container)
	if errors.Is(err, crilog.ErrNotFound) {
		return status.Error(codes.NotFound, err.Error())
	}
	if err != nil {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	f, err := os.Open(path)
	if err != nil {
		return status.Errorf(codes.Internal, "open the log: %v", err)
	}
	defer func() { f.Close() }()
	tail, r, err := crilog.Tail(f, int(req.TailLines))
	if err != nil {
		return status.Errorf(codes.Internal, "read %s: %v", path, err)
	}
	var chunk bytes.Buffer
	for i, e := range tail {
		chunk.Write(e.Line)
		chunk.WriteByte('\n')
		if chunk.Len() >= podLogChunk || i == len(tail)-1 {
			if err := stream.Send(&machine.LogsChunk{Data: chunk.Bytes()}); err != nil {
				return err
			}
			chunk.Reset()
		}
	}
	if !req.Follow {
		return nil
	}
	poll := time.NewTicker(podLogPoll)
	defer poll.Stop()
	for {
		e, err := r.Next()
		switch {
		case err == nil:
			if err := stream.Send(&machine.LogsChunk{Data: append(e.Line, '\n')}); err != nil {
				return err
			}
			continue
		case errors.Is(err, crilog.ErrFormat):
			continue
		case err != io.EOF:
			return status.Errorf(codes.Internal, "read %s: %v", path, err)
		}
		cur, err := os.Stat(path)
		if errors.Is(err, os.ErrNotExist) {
			return nil // removed with its pod
		}
		if old, oerr := f.Stat(); err == nil && oerr == nil && !os.SameFile(old, cur) {
			// Rotated: the old file was read to its end, the runtime
			// writes on in a new one.
			nf, err := os.Open(path)
			if err != nil {
				return status.Errorf(codes.Internal, "open the rotated log: %v", err)
			}
			f.Close()
			f, r = nf, crilog.NewReader(nf)
			continue
		}
		select {
		case <-stream.Context().Done():
			return nil
		case <-poll.C:
		}
	}
}
