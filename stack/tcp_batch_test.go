package stack_test

import (
	"sort"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip/seqnum"

	"github.com/xdp-onload/onload/internal/pkt"
	"github.com/xdp-onload/onload/stack"
	"github.com/xdp-onload/onload/vnic"
)

// TestBatchAcks: eight full segments in order that one poll takes in
// draw two ACKs, one for every fourth (tcp_batch.go), where one for every
// second would be four; with the third segment lost, each segment after
// the gap draws its duplicate ACK at once, five of them, as the sender's
// loss detection needs.
func TestBatchAcks(t *testing.T) {
	for _, tc := range []struct {
		name   string
		drop   int // the segment lost on the way (0: none)
		acks   int
		unread int // segments the server can read
	}{
		{"in order", 0, 2, 8},
		{"third lost", 3, 5, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b, na, nb := twoStacksNICs(t, vnic.MemConfig{})
			poll := pollBoth(a, b)
			c, srv := connectPair(t, a, b, poll)
			a.SetOption(c, stack.NoDelay, 1)
			ti, _ := a.TCPInfo(c)
			mss := int(ti.MSS)
			waitAcked(t, a, c, poll, 2*time.Second)
			mustSend(t, a, c, make([]byte, 8*mss))

			// The eight segments, off b's wire, go back on it but the
			// one lost.
			// Only the first copy of each data segment is kept: on a busy
			// machine a's retransmission timer may fire while the loop
			// polls it, and a window update may come with the data.
			hs := make([]vnic.Handle, 16)
			var frames [][]byte
			seen := map[uint32]bool{}
			for end := time.Now().Add(2 * time.Second); len(frames) < 8 && time.Now().Before(end); {
				a.Poll()
				n := nb.Receive(hs)
				for _, h := range hs[:n] {
					d := nb.Pool().Data(h)
					if f, err := pkt.Parse(d); err == nil && len(f.Payload) > 0 && !seen[f.Seq] && len(frames) < 8 {
						seen[f.Seq] = true
						frames = append(frames, append([]byte(nil), d...))
					}
					nb.Pool().Free(h)
				}
			}
			if len(frames) != 8 {
				t.Fatalf("%d data segments on the wire, want 8", len(frames))
			}
			sort.Slice(frames, func(i, j int) bool {
				fi, _ := pkt.Parse(frames[i])
				fj, _ := pkt.Parse(frames[j])
				return seqnum.Value(fi.Seq).LessThan(seqnum.Value(fj.Seq))
			})
			first, _ := pkt.Parse(frames[0])
			for i, f := range frames {
				if i+1 == tc.drop {
					continue
				}
				h := na.Pool().Alloc()
				na.Pool().SetLen(h, copy(na.Pool().Buf(h), f))
				if k, err := na.Transmit([]vnic.Handle{h}); k != 1 {
					t.Fatalf("put segment %d back: %v", i+1, err)
				}
			}
			b.Poll() // one batch

			want := first.Seq + uint32(8*mss) // every segment acknowledged
			if tc.drop != 0 {
				want = first.Seq + uint32((tc.drop-1)*mss) // duplicate ACKs of the gap
			}
			var acks []uint32
			for n := na.Receive(hs); n > 0; n = na.Receive(hs) {
				for _, h := range hs[:n] {
					if f, err := pkt.Parse(na.Pool().Data(h)); err == nil && len(f.Payload) == 0 {
						acks = append(acks, f.Ack-first.Seq)
					}
					na.Pool().Free(h)
				}
			}
			if len(acks) != tc.acks || acks[len(acks)-1] != want-first.Seq {
				t.Fatalf("ACKs of the batch (relative): %v; want %d of them, the last %d", acks, tc.acks, want-first.Seq)
			}
			t.Logf("ACKs of the batch (relative): %v", acks)
			if got, _ := b.TCPInfo(srv); int(got.Unread) != tc.unread*mss {
				t.Fatalf("the server holds %d bytes to read, want %d", got.Unread, tc.unread*mss)
			}
		})
	}
}
