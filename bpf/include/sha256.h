/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The MPTCP v1 token: the most significant 32 bits of SHA-256 over the 64-bit
 * key (RFC 8684 section 3.1, "Token"). The key is a single 8-byte message, so
 * one 64-byte padded block and one compression suffice. The message schedule
 * is kept as a 16-word ring to stay well under the 512-byte stack limit. */
#pragma once

#include "common.h"

static volatile const __u32 sha256_k[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

#define ROTR32(x, n) (((x) >> (n)) | ((x) << (32 - (n))))

/* mptcp_token returns the token for a key given as it appears on the wire
 * (network byte order, most significant byte first). */
static __noinline __u32 mptcp_token(__u32 key_hi, __u32 key_lo)
{
	__u32 w[16] = {};
	__u32 a = 0x6a09e667, b = 0xbb67ae85, c = 0x3c6ef372, d = 0xa54ff53a;
	__u32 e = 0x510e527f, f = 0x9b05688c, g = 0x1f83d9ab, h = 0x5be0cd19;

	w[0] = key_hi;
	w[1] = key_lo;
	w[2] = 0x80000000; /* the padding's leading 1 bit */
	w[15] = 64;	   /* message length in bits */

	/* A plain bounded loop: unrolled, the 64 rounds spill so much that
	 * the caller's and this frame's stacks exceed the 512-byte limit. */
#pragma clang loop unroll(disable)
	for (int i = 0; i < 64; i++) {
		__u32 wi, s0, s1, ch, maj, t1, t2;

		if (i < 16) {
			wi = w[i];
		} else {
			__u32 w15 = w[(i - 15) & 15], w2 = w[(i - 2) & 15];

			s0 = ROTR32(w15, 7) ^ ROTR32(w15, 18) ^ (w15 >> 3);
			s1 = ROTR32(w2, 17) ^ ROTR32(w2, 19) ^ (w2 >> 10);
			wi = w[i & 15] + s0 + w[(i - 7) & 15] + s1;
			w[i & 15] = wi;
		}
		s1 = ROTR32(e, 6) ^ ROTR32(e, 11) ^ ROTR32(e, 25);
		ch = (e & f) ^ (~e & g);
		t1 = h + s1 + ch + sha256_k[i] + wi;
		s0 = ROTR32(a, 2) ^ ROTR32(a, 13) ^ ROTR32(a, 22);
		maj = (a & b) ^ (a & c) ^ (b & c);
		t2 = s0 + maj;
		h = g;
		g = f;
		f = e;
		e = d + t1;
		d = c;
		c = b;
		b = a;
		a = t1 + t2;
	}
	return 0x6a09e667 + a;
}
