/*
 * kiln_hash64.c -- kiln.lane64, the hash the weights of a library are checked by
 * (kiln_check.c holds the table and the check; docs/format.md "The weights check
 * record").
 *
 * kiln.lane64 version 1 of n bytes: the bytes as little-endian 64-bit lanes
 * x_0 .. x_{m-1} (the last one zero-padded), key_i = (i + 1) * K, and
 *     h = mix(n ^ (sum over i of mix(x_i ^ key_i)))   (mod 2^64)
 * where mix is MurmurHash3's 64-bit finaliser (a bijection that spreads each bit
 * over the word). A change within one lane always changes the sum; damage spread
 * over several lanes escapes with a chance of about 2^-64. It finds damage, not
 * tampering (the file-level SHA-256s stay for that and for identity). Every lane
 * is independent, so the loop vectorises (kiln.artifact.integrity.lane64 is the
 * same hash in numpy, which export uses to write the table).
 *
 * export_library writes one #define, then this file verbatim (the same text for
 * every library of one prefix, so a process compiles it once):
 *   KILN_CHECK_HASH      `{prefix}_hash64`: the hash of any bytes (exported)
 */
#include <stdint.h>
#include <string.h>

#define KILN_LANE_KEY 0x9E3779B97F4A7C15ULL
#define KILN_MIX_C1 0xFF51AFD7ED558CCDULL
#define KILN_MIX_C2 0xC4CEB9FE1A85EC53ULL

static inline uint64_t kiln_check_mix(uint64_t z) {
  z ^= z >> 33;
  z *= KILN_MIX_C1;
  z ^= z >> 33;
  z *= KILN_MIX_C2;
  z ^= z >> 33;
  return z;
}

static inline uint64_t kiln_check_lane(const uint8_t *p) {
  uint64_t x;
  memcpy(&x, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  x = __builtin_bswap64(x);
#endif
  return x;
}

/* The lanes loop vectorises with AVX-512's 64-bit multiply (about 3x the scalar
   speed); on x86-64 Linux with GCC the best of three builds is picked at load. */
#if defined(__x86_64__) && defined(__linux__) && defined(__GNUC__) && !defined(__clang__)
#define KILN_CHECK_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"), optimize("O3")))
#else
#define KILN_CHECK_CLONES
#endif

KILN_CHECK_CLONES static uint64_t kiln_check_sum(const uint8_t *p, uint64_t lanes) {
  uint64_t h = 0;
  for (uint64_t i = 0; i < lanes; i++)
    h += kiln_check_mix(kiln_check_lane(p + 8 * i) ^ ((i + 1) * KILN_LANE_KEY));
  return h;
}

/* kiln.lane64 of the n bytes at p. */
__attribute__((visibility("default"))) uint64_t KILN_CHECK_HASH(const void *data, uint64_t n) {
  const uint8_t *p = (const uint8_t *)data;
  uint64_t lanes = n / 8;
  uint64_t h = kiln_check_sum(p, lanes);
  if (n % 8) {
    uint8_t last[8] = {0};
    memcpy(last, p + 8 * lanes, (size_t)(n % 8));
    h += kiln_check_mix(kiln_check_lane(last) ^ ((lanes + 1) * KILN_LANE_KEY));
  }
  return kiln_check_mix(h ^ n);
}
