package sha2

import (
	"bytes"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/hex"
	"math/rand/v2"
	"testing"
)

// The FIPS 180-4 examples ("abc", the two-block message) and the empty
// message.
func TestKnownDigests(t *testing.T) {
	two := "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"
	two512 := "abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu"
	for _, c := range []struct{ in, want string }{
		{"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
		{"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
		{two, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
	} {
		if got := Sum256([]byte(c.in)); hex.EncodeToString(got[:]) != c.want {
			t.Errorf("Sum256(%q) = %x, want %s", c.in, got, c.want)
		}
	}
	for _, c := range []struct{ in, want string }{
		{"", "cf83e1357eefb8bdf1542850d66d8007d620e4050b5715dc83f4a921d36ce9ce47d0d13c5d85f2b0ff8318d2877eec2f63b931bd47417a81a538327af927da3e"},
		{"abc", "ddaf35a193617abacc417349ae20413112e6fa4e89a97ea20a9eeee64b55d39a2192992a274fc1a836ba3c23a3feebbd454d4423643ce80e2a9ac94fa54ca49f"},
		{two512, "8e959b75dae313da8cf4f72814fc143f8f7779c6eb9f7fa17299aeadb6889018501d289e4900f7e4331b99dec4b5433ac7d329eeb6dd26545e96e55b874be909"},
	} {
		if got := Sum512([]byte(c.in)); hex.EncodeToString(got[:]) != c.want {
			t.Errorf("Sum512(%q) = %x, want %s", c.in, got, c.want)
		}
	}
}

// Every length around the block boundaries, and longer ones, as the
// standard library digests them; New256 written in random pieces.
func TestAsTheStandardLibrary(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	msg := make([]byte, 1100)
	for i := range msg {
		msg[i] = byte(r.Uint32())
	}
	for n := 0; n <= len(msg); n++ {
		b := msg[:n]
		if got, want := Sum256(b), sha256.Sum256(b); got != want {
			t.Fatalf("Sum256 of %d bytes = %x, want %x", n, got, want)
		}
		if got, want := Sum512(b), sha512.Sum512(b); got != want {
			t.Fatalf("Sum512 of %d bytes = %x, want %x", n, got, want)
		}
		h := New256()
		for rest := b; len(rest) > 0; {
			k := min(len(rest), r.IntN(150))
			h.Write(rest[:k])
			rest = rest[k:]
		}
		want := sha256.Sum256(b)
		if got := h.Sum(nil); !bytes.Equal(got, want[:]) {
			t.Fatalf("New256 of %d bytes in pieces = %x, want %x", n, got, want)
		}
		// Sum leaves the hash as it was: more can be written after it
		h.Write([]byte("x"))
		want = sha256.Sum256(append(append([]byte{}, b...), 'x'))
		if got := h.Sum([]byte("prefix")); !bytes.Equal(got, append([]byte("prefix"), want[:]...)) {
			t.Fatalf("New256 of %d bytes, summed, then one more: %x, want prefix + %x", n, got, want)
		}
	}
	h := New256()
	if h.Size() != sha256.Size || h.BlockSize() != sha256.BlockSize {
		t.Errorf("Size, BlockSize = %d, %d; want %d, %d", h.Size(), h.BlockSize(), sha256.Size, sha256.BlockSize)
	}
	h.Write(msg)
	h.Reset()
	if got, want := h.Sum(nil), sha256.Sum256(nil); !bytes.Equal(got, want[:]) {
		t.Errorf("after Reset: %x, want %x", got, want)
	}
}
