// Package sha2 computes SHA-256 and SHA-512 (FIPS 180-4) for the names
// portmap gives the kernel's objects: upstream's chain names are the hex
// SHA-512 of network and container ID, ours hash with SHA-256. Nothing
// here is a secret or guards one.
//
// The standard library's crypto/sha256 and crypto/sha512 link Go's FIPS
// 140 module whole — a DRBG, AES-GCM, SHA-3, HMAC and their self-tests,
// about 230 KB of the plugin binary — for names that need none of it.
// The tests hold both functions to the standard library's, byte for byte.
package sha2

import (
	"encoding/binary"
	"hash"
	"math/bits"
)

// Size256 and Size512 are the lengths of the two digests in bytes.
const (
	Size256 = 32
	Size512 = 64
)

var k256 = [64]uint32{
	0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
	0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
	0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
	0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
	0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
	0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
	0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
	0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
}

var k512 = [80]uint64{
	0x428a2f98d728ae22, 0x7137449123ef65cd, 0xb5c0fbcfec4d3b2f, 0xe9b5dba58189dbbc,
	0x3956c25bf348b538, 0x59f111f1b605d019, 0x923f82a4af194f9b, 0xab1c5ed5da6d8118,
	0xd807aa98a3030242, 0x12835b0145706fbe, 0x243185be4ee4b28c, 0x550c7dc3d5ffb4e2,
	0x72be5d74f27b896f, 0x80deb1fe3b1696b1, 0x9bdc06a725c71235, 0xc19bf174cf692694,
	0xe49b69c19ef14ad2, 0xefbe4786384f25e3, 0x0fc19dc68b8cd5b5, 0x240ca1cc77ac9c65,
	0x2de92c6f592b0275, 0x4a7484aa6ea6e483, 0x5cb0a9dcbd41fbd4, 0x76f988da831153b5,
	0x983e5152ee66dfab, 0xa831c66d2db43210, 0xb00327c898fb213f, 0xbf597fc7beef0ee4,
	0xc6e00bf33da88fc2, 0xd5a79147930aa725, 0x06ca6351e003826f, 0x142929670a0e6e70,
	0x27b70a8546d22ffc, 0x2e1b21385c26c926, 0x4d2c6dfc5ac42aed, 0x53380d139d95b3df,
	0x650a73548baf63de, 0x766a0abb3c77b2a8, 0x81c2c92e47edaee6, 0x92722c851482353b,
	0xa2bfe8a14cf10364, 0xa81a664bbc423001, 0xc24b8b70d0f89791, 0xc76c51a30654be30,
	0xd192e819d6ef5218, 0xd69906245565a910, 0xf40e35855771202a, 0x106aa07032bbd1b8,
	0x19a4c116b8d2d0c8, 0x1e376c085141ab53, 0x2748774cdf8eeb99, 0x34b0bcb5e19b48a8,
	0x391c0cb3c5c95a63, 0x4ed8aa4ae3418acb, 0x5b9cca4f7763e373, 0x682e6ff3d6b2b8a3,
	0x748f82ee5defb2fc, 0x78a5636f43172f60, 0x84c87814a1f0ab72, 0x8cc702081a6439ec,
	0x90befffa23631e28, 0xa4506cebde82bde9, 0xbef9a3f7b2c67915, 0xc67178f2e372532b,
	0xca273eceea26619c, 0xd186b8c721c0c207, 0xeada7dd6cde0eb1e, 0xf57d4f7fee6ed178,
	0x06f067aa72176fba, 0x0a637dc5a2c898a6, 0x113f9804bef90dae, 0x1b710b35131c471b,
	0x28db77f523047d84, 0x32caab7b40c72493, 0x3c9ebe0a15c9bebc, 0x431d67c49c100d4c,
	0x4cc5d4becb3e42b6, 0x597f299cfc657e2a, 0x5fcb6fab3ad6faec, 0x6c44198c4a475817,
}

// Sum256 is the SHA-256 digest of b.
func Sum256(b []byte) [Size256]byte {
	var d digest256
	d.Reset()
	d.Write(b)
	var out [Size256]byte
	d.sum(out[:0])
	return out
}

// New256 is a SHA-256 hash.Hash.
func New256() hash.Hash {
	d := new(digest256)
	d.Reset()
	return d
}

type digest256 struct {
	h   [8]uint32
	buf [64]byte
	n   int    // bytes in buf
	len uint64 // bytes written in all
}

func (d *digest256) Reset() {
	d.h = [8]uint32{0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19}
	d.n, d.len = 0, 0
}

func (d *digest256) Size() int      { return Size256 }
func (d *digest256) BlockSize() int { return 64 }

func (d *digest256) Write(p []byte) (int, error) {
	n := len(p)
	d.len += uint64(n)
	if d.n > 0 {
		c := copy(d.buf[d.n:], p)
		d.n += c
		p = p[c:]
		if d.n < 64 {
			return n, nil
		}
		d.block(d.buf[:])
		d.n = 0
	}
	for len(p) >= 64 {
		d.block(p[:64])
		p = p[64:]
	}
	d.n = copy(d.buf[:], p)
	return n, nil
}

// Sum appends the digest of what was written to b; d is left as it was.
func (d *digest256) Sum(b []byte) []byte {
	c := *d
	return c.sum(b)
}

func (d *digest256) sum(b []byte) []byte {
	bitLen := d.len << 3
	var pad [72]byte
	pad[0] = 0x80
	padLen := 55 - int(d.len%64)
	if padLen < 0 {
		padLen += 64
	}
	binary.BigEndian.PutUint64(pad[1+padLen:], bitLen)
	d.Write(pad[:1+padLen+8])
	for _, v := range d.h {
		b = binary.BigEndian.AppendUint32(b, v)
	}
	return b
}

func (d *digest256) block(p []byte) {
	var w [64]uint32
	for i := 0; i < 16; i++ {
		w[i] = binary.BigEndian.Uint32(p[4*i:])
	}
	for i := 16; i < 64; i++ {
		s0 := bits.RotateLeft32(w[i-15], -7) ^ bits.RotateLeft32(w[i-15], -18) ^ w[i-15]>>3
		s1 := bits.RotateLeft32(w[i-2], -17) ^ bits.RotateLeft32(w[i-2], -19) ^ w[i-2]>>10
		w[i] = w[i-16] + s0 + w[i-7] + s1
	}
	a, b, c, dd, e, f, g, h := d.h[0], d.h[1], d.h[2], d.h[3], d.h[4], d.h[5], d.h[6], d.h[7]
	for i := 0; i < 64; i++ {
		t1 := h + (bits.RotateLeft32(e, -6) ^ bits.RotateLeft32(e, -11) ^ bits.RotateLeft32(e, -25)) + (e&f ^ ^e&g) + k256[i] + w[i]
		t2 := (bits.RotateLeft32(a, -2) ^ bits.RotateLeft32(a, -13) ^ bits.RotateLeft32(a, -22)) + (a&b ^ a&c ^ b&c)
		h, g, f, e, dd, c, b, a = g, f, e, dd+t1, c, b, a, t1+t2
	}
	for i, v := range [8]uint32{a, b, c, dd, e, f, g, h} {
		d.h[i] += v
	}
}

// Sum512 is the SHA-512 digest of b.
func Sum512(b []byte) [Size512]byte {
	h := [8]uint64{
		0x6a09e667f3bcc908, 0xbb67ae8584caa73b, 0x3c6ef372fe94f82b, 0xa54ff53a5f1d36f1,
		0x510e527fade682d1, 0x9b05688c2b3e6c1f, 0x1f83d9abfb41bd6b, 0x5be0cd19137e2179,
	}
	n := len(b)
	for len(b) >= 128 {
		block512(&h, b[:128])
		b = b[128:]
	}
	// the tail, 0x80, zeros and the length in bits as 128 bits: one
	// block or two
	var tail [256]byte
	t := copy(tail[:], b)
	tail[t] = 0x80
	end := 128
	if t+1+16 > 128 {
		end = 256
	}
	binary.BigEndian.PutUint64(tail[end-16:], uint64(n)>>61)
	binary.BigEndian.PutUint64(tail[end-8:], uint64(n)<<3)
	for i := 0; i < end; i += 128 {
		block512(&h, tail[i:i+128])
	}
	var out [Size512]byte
	for i, v := range h {
		binary.BigEndian.PutUint64(out[8*i:], v)
	}
	return out
}

func block512(hs *[8]uint64, p []byte) {
	var w [80]uint64
	for i := 0; i < 16; i++ {
		w[i] = binary.BigEndian.Uint64(p[8*i:])
	}
	for i := 16; i < 80; i++ {
		s0 := bits.RotateLeft64(w[i-15], -1) ^ bits.RotateLeft64(w[i-15], -8) ^ w[i-15]>>7
		s1 := bits.RotateLeft64(w[i-2], -19) ^ bits.RotateLeft64(w[i-2], -61) ^ w[i-2]>>6
		w[i] = w[i-16] + s0 + w[i-7] + s1
	}
	a, b, c, d, e, f, g, h := hs[0], hs[1], hs[2], hs[3], hs[4], hs[5], hs[6], hs[7]
	for i := 0; i < 80; i++ {
		t1 := h + (bits.RotateLeft64(e, -14) ^ bits.RotateLeft64(e, -18) ^ bits.RotateLeft64(e, -41)) + (e&f ^ ^e&g) + k512[i] + w[i]
		t2 := (bits.RotateLeft64(a, -28) ^ bits.RotateLeft64(a, -34) ^ bits.RotateLeft64(a, -39)) + (a&b ^ a&c ^ b&c)
		h, g, f, e, d, c, b, a = g, f, e, d+t1, c, b, a, t1+t2
	}
	for i, v := range [8]uint64{a, b, c, d, e, f, g, h} {
		hs[i] += v
	}
}
