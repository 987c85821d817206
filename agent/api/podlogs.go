package api

import (
	"bytes"
	"errors"
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
	path, err := crilog.Find(s.podLogRoot, req.Namespace, req.Pod, req.Container, false)
	if errors.Is(err, crilog.ErrNotFound) {
		return status.Error(codes.NotFound, err.Error())
	}
	if err != nil {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	tail := int(req.TailLines)
	if tail <= 0 {
		tail = -1 // the request's 0 means every line
	}
	var chunk bytes.Buffer
	var sendErr error // the stream's, as is, for gRPC to see
	err = crilog.Stream(stream.Context(), path, crilog.StreamOptions{Tail: tail, Follow: req.Follow, Poll: podLogPoll}, func(es []crilog.Entry) error {
		for i, e := range es {
			chunk.Write(e.Line)
			chunk.WriteByte('\n')
			if chunk.Len() >= podLogChunk || i == len(es)-1 {
				if sendErr = stream.Send(&machine.LogsChunk{Data: chunk.Bytes()}); sendErr != nil {
					return sendErr
				}
				chunk.Reset()
			}
		}
		return nil
	})
	switch {
	case sendErr != nil:
		return sendErr
	case err != nil:
		return status.Errorf(codes.Internal, "%v", err)
	}
	return nil
}
