package proxy

import (
	"encoding/binary"
	"errors"
	"fmt"
	"syscall"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// A txn is one transaction as it is compiled: the library builds the
// messages, and every txnChunk of them are laid out as the kernel reads
// them and dropped, so that a transaction of tens of megabytes is held
// once, as the bytes sent, and not also as the library's messages. The
// bytes go in pieces of txnPiece, sent as one sendmsg's iovecs: no piece
// is copied into a bigger one as the transaction grows. The pieces are
// mapped outside Go's heap and unmapped once sent: the garbage collector
// lets the heap grow to twice what is live, and tens of megabytes held for
// a moment would double for no use.
//
// The library is given a dial that takes each part it flushes; the
// transaction goes to the kernel from send, on the programmer's own socket.
type txn struct {
	n       *nftProgrammer
	c       *nftables.Conn
	bufs    [][]byte             // the messages laid out, in pieces
	size    int                  // of all the pieces
	types   []netlink.HeaderType // of each message, to name a refused one
	first   uint32               // the sequence number of the first message
	last    []byte               // the last message laid out
	end     netlink.Message      // the batch's end, laid out by send
	pending int                  // messages queued in c since the last flush
	err     error
	begun   bool // the batch's begin is laid out
}

// txnChunk is how many messages the library holds before they are laid
// out: a few megabytes of its structures at most.
const txnChunk = 1024

// txnPiece is the size of the pieces a transaction is laid out in (a
// message bigger than that is a piece of its own): a full sync of 50 000
// Services is a few dozen, well under the kernel's 1 024 iovecs.
const txnPiece = 4 << 20

// newTxn starts a transaction. A fresh Conn for each: a Conn queues
// messages until Flush, and a plan that fails half-way must leave nothing
// queued for the next.
func (n *nftProgrammer) newTxn() (*txn, error) {
	t := &txn{n: n, first: n.seq + 1}
	c, err := nftables.New(nftables.WithTestDial(func(req []netlink.Message) ([]netlink.Message, error) {
		if len(req) == 0 {
			// The library waits for an acknowledgement of each message;
			// the kernel's answer comes to send.
			return []netlink.Message{{Header: netlink.Header{Type: netlink.Error}, Data: make([]byte, 20)}}, nil
		}
		t.take(req)
		return nil, nil
	}))
	if err != nil {
		return nil, fmt.Errorf("open nftables netlink connection: %w", err)
	}
	t.c = c
	return t, nil
}

// queued counts k more messages queued in the library, and lays them out
// once there are txnChunk.
func (t *txn) queued(k int) {
	if t.pending += k; t.pending >= txnChunk {
		t.flush()
	}
}

func (t *txn) flush() {
	if err := t.c.Flush(); err != nil && t.err == nil {
		t.err = err
	}
	t.pending = 0
}

// take lays out one part the library flushed: a batch of its own, whose
// begin is kept for the first part only and whose end for send.
func (t *txn) take(req []netlink.Message) {
	if len(req) < 2 {
		return
	}
	body := req[1 : len(req)-1]
	if !t.begun {
		t.begun = true
		body = req[:len(req)-1]
	}
	t.end = req[len(req)-1]
	for _, m := range body {
		t.put(m)
	}
}

// put appends m with the next sequence number, not asking for an
// acknowledgement.
func (t *txn) put(m netlink.Message) {
	const hdr = unix.NLMSG_HDRLEN
	size := hdr + len(m.Data)
	aligned := (size + unix.NLMSG_ALIGNTO - 1) &^ (unix.NLMSG_ALIGNTO - 1)
	if len(t.bufs) == 0 || cap(t.bufs[len(t.bufs)-1])-len(t.bufs[len(t.bufs)-1]) < aligned {
		piece, err := unix.Mmap(-1, 0, max(txnPiece, aligned), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
		if err != nil {
			if t.err == nil {
				t.err = fmt.Errorf("map %d bytes for the transaction: %w", max(txnPiece, aligned), err)
			}
			return
		}
		t.bufs = append(t.bufs, piece[:0])
	}
	piece := &t.bufs[len(t.bufs)-1]
	off := len(*piece)
	*piece = (*piece)[:off+aligned]
	b := (*piece)[off:]
	t.n.seq++
	ne := binary.NativeEndian
	ne.PutUint32(b, uint32(size))
	ne.PutUint16(b[4:], uint16(m.Header.Type))
	ne.PutUint16(b[6:], uint16(m.Header.Flags&^(netlink.Acknowledge|unix.NLM_F_ECHO)))
	ne.PutUint32(b[8:], t.n.seq)
	// nlmsg_pid stays 0: the kernel.
	copy(b[hdr:], m.Data)
	t.types = append(t.types, m.Header.Type)
	t.size += aligned
	t.last = b
}

// release unmaps the pieces.
func (t *txn) release() {
	for _, b := range t.bufs {
		_ = unix.Munmap(b[:cap(b)])
	}
	t.bufs = nil
}

// send lays out what the library still holds and the batch's end, and
// sends the transaction in one sendmsg, asking for an acknowledgement of
// its last message only, as nft does (the library asks for one of every
// message and an echo of every rule: at tens of thousands of rules the
// answers alone overflow the socket). The kernel handles the batch within
// the sendmsg, so by its return every answer is queued: errors, then the
// acknowledgement. It returns the refusals, naming the messages refused.
func (t *txn) send() error {
	t.flush()
	if t.err != nil {
		return t.err
	}
	if len(t.types) < 2 {
		return nil // the batch's begin alone: nothing to do
	}
	ne := binary.NativeEndian
	ne.PutUint16(t.last[6:], ne.Uint16(t.last[6:])|uint16(netlink.Acknowledge))
	lastSeq := t.n.seq
	t.put(t.end) // the end is not acknowledged: the kernel only reads it
	raw, err := t.n.tx.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := raw.Write(func(fd uintptr) bool {
		_, serr = unix.SendmsgBuffers(int(fd), t.bufs, nil, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}, 0)
		return !errors.Is(serr, unix.EAGAIN)
	}); err != nil {
		return fmt.Errorf("send batch: %w", err)
	}
	if serr != nil {
		return fmt.Errorf("send batch (%d bytes): %w", t.size, serr)
	}
	t.release()
	var errs []error
	acked := false
	buf := make([]byte, 1<<16)
	for !acked {
		var nr int
		var rerr error
		if err := raw.Read(func(fd uintptr) bool {
			nr, _, rerr = unix.Recvfrom(int(fd), buf, unix.MSG_DONTWAIT)
			return true
		}); err != nil {
			return err
		}
		if errors.Is(rerr, unix.EAGAIN) {
			break
		}
		if rerr != nil {
			return fmt.Errorf("receive answers: %w", rerr)
		}
		answers, err := syscall.ParseNetlinkMessage(buf[:nr])
		if err != nil {
			return fmt.Errorf("parse answers: %w", err)
		}
		for _, a := range answers {
			if a.Header.Type != unix.NLMSG_ERROR || len(a.Data) < 4 {
				continue
			}
			code := -int32(binaryutil.NativeEndian.Uint32(a.Data[:4]))
			if a.Header.Seq == lastSeq {
				acked = true
			}
			if code != 0 {
				i := int(a.Header.Seq - t.first)
				what := "message"
				if i >= 0 && i < len(t.types) {
					what = msgName(t.types[i])
				}
				errs = append(errs, fmt.Errorf("%s (message %d of %d): %w", what, i, len(t.types), unix.Errno(code)))
			}
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	if !acked {
		return errors.New("the kernel did not acknowledge the batch")
	}
	return nil
}
