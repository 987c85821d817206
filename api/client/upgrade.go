package client

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/cairn-os/cairn/api/machine"
	"google.golang.org/grpc"
)

// chunkSize is the UKI's bytes per message, well under gRPC's 4 MiB.
const chunkSize = 1 << 20

// UpgradeStream is an Upgrade call, of the Machine API or of init's.
type UpgradeStream = grpc.BidiStreamingClient[machine.UpgradeRequest, machine.UpgradeProgress]

// SendUKI sends the UKI at path on stream: the header h with the file's
// size and SHA-256 filled in, then its bytes. It hands each progress
// message to progress as it comes, and returns the last one once the node
// ends the call, or the node's error.
func SendUKI(stream UpgradeStream, path string, h *machine.UpgradeHeader, progress func(*machine.UpgradeProgress)) (*machine.UpgradeProgress, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sum := sha256.New()
	size, err := io.Copy(sum, f)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, err
	}
	h.Size, h.Sha256 = uint64(size), hex.EncodeToString(sum.Sum(nil))

	// The node's answers are read while the bytes go: it may refuse early.
	type result struct {
		last *machine.UpgradeProgress
		err  error
	}
	done := make(chan result, 1)
	go func() {
		last, err := follow(stream, progress)
		done <- result{last, err}
	}()
	sendErr := send(stream, f, h)
	r := <-done
	if r.err != nil {
		return r.last, r.err
	}
	if sendErr != nil {
		return r.last, sendErr
	}
	return r.last, nil
}

// SendRef asks on stream for the upgrade that h names by its image_ref,
// which the node pulls, and follows it as SendUKI does.
func SendRef(stream UpgradeStream, h *machine.UpgradeHeader, progress func(*machine.UpgradeProgress)) (*machine.UpgradeProgress, error) {
	// A refusal (EOF on Send) is read from the stream.
	if err := sendError(stream.Send(&machine.UpgradeRequest{Part: &machine.UpgradeRequest_Header{Header: h}})); err != nil {
		return nil, err
	}
	stream.CloseSend()
	return follow(stream, progress)
}

// follow hands each progress message to progress until the node ends the
// call, and returns the last one, or the node's error.
func follow(stream UpgradeStream, progress func(*machine.UpgradeProgress)) (*machine.UpgradeProgress, error) {
	var last *machine.UpgradeProgress
	for {
		p, err := stream.Recv()
		if err == io.EOF {
			return last, nil
		}
		if err != nil {
			return last, err
		}
		last = p
		progress(p)
	}
}

// send sends the header, then the file in chunks, then closes its side.
func send(stream UpgradeStream, f io.Reader, h *machine.UpgradeHeader) error {
	if err := stream.Send(&machine.UpgradeRequest{Part: &machine.UpgradeRequest_Header{Header: h}}); err != nil {
		return sendError(err)
	}
	buf := make([]byte, chunkSize)
	for {
		n, err := f.Read(buf)
		if n > 0 {
			if err := stream.Send(&machine.UpgradeRequest{Part: &machine.UpgradeRequest_Chunk{Chunk: buf[:n]}}); err != nil {
				return sendError(err)
			}
		}
		if err == io.EOF {
			return stream.CloseSend()
		}
		if err != nil {
			return err
		}
	}
}

// sendError is nil for io.EOF: the node ended the call, and says why in
// what Recv returns.
func sendError(err error) error {
	if errors.Is(err, io.EOF) {
		return nil
	}
	return err
}
