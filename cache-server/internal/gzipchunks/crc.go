package gzipchunks

// CRC-32 (IEEE) of a concatenation from the CRCs of its parts: a gzip
// trailer holds the CRC of the whole body, and a cached segment must not
// be read again to compute it (not reading it is the point). The method is
// zlib's crc32_combine (since 1.2.12): appending len2 bytes multiplies the
// first part's CRC by x^(8*len2) modulo the CRC polynomial, in the
// reflected bit order CRC-32 uses; x^(2^k) mod p for k < 32 is computed
// once, so an operator for a length takes at most 64 multiplications and
// applying it takes one.

// crcPoly is the IEEE polynomial, reflected (hash/crc32.IEEE).
const crcPoly = 0xedb88320

// multModP is a(x)*b(x) modulo p(x), polynomials in reflected order (bit
// 31 is x^0).
func multModP(a, b uint32) uint32 {
	m := uint32(1) << 31
	var p uint32
	for {
		if a&m != 0 {
			p ^= b
			if a&(m-1) == 0 {
				return p
			}
		}
		m >>= 1
		if b&1 != 0 {
			b = b>>1 ^ crcPoly
		} else {
			b >>= 1
		}
	}
}

// x2nTable holds x^(2^k) mod p for k = 0..31.
type x2nTable [32]uint32

func newX2nTable() *x2nTable {
	var t x2nTable
	p := uint32(1) << 30 // x^1
	t[0] = p
	for k := 1; k < len(t); k++ {
		p = multModP(p, p)
		t[k] = p
	}
	return &t
}

// shiftOp is the operator that appends n bytes: x^(8n) mod p.
func (t *x2nTable) shiftOp(n int64) uint32 {
	p := uint32(1) << 31 // x^0
	k := 3               // 8n = n << 3
	for u := uint64(n); u != 0; u >>= 1 {
		if u&1 != 0 {
			p = multModP(t[k&31], p)
		}
		k++
	}
	return p
}

// crcCombine is the CRC of A followed by B from crcA, crcB and the
// operator of B's length (shiftOp).
func crcCombine(crcA, crcB, op uint32) uint32 {
	return multModP(op, crcA) ^ crcB
}
