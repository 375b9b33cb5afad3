/*
 * kiln_check.c -- the check of a library's weights at memory bandwidth, for the
 * Python loader (through ctypes) and for a plain C host alike (docs/runtime.md
 * "Checking the weights", docs/format.md "The weights check record").
 *
 * The hash, kiln.lane64 version 1, of n bytes: the bytes as little-endian 64-bit
 * lanes x_0 .. x_{m-1} (the last one zero-padded), key_i = (i + 1) * K, and
 *     h = mix(n ^ (sum over i of mix(x_i ^ key_i)))   (mod 2^64)
 * where mix is MurmurHash3's 64-bit finaliser (a bijection that spreads each bit
 * over the word). A change within one lane always changes the sum; damage spread
 * over several lanes escapes with a chance of about 2^-64. It finds damage, not
 * tampering (the file-level SHA-256s stay for that and for identity). Every lane
 * is independent, so the loop vectorises (kiln.artifact.integrity.lane64_digests
 * is the same hash in numpy, which export uses to write the table).
 *
 * export_library writes a few #defines, then this file verbatim:
 *   KILN_CHECK_HASH      `{prefix}_hash64`: the hash of any bytes (exported)
 *   KILN_CHECK_WEIGHTS   `{prefix}_check_weights`: check chunks (exported)
 *   KILN_CHECK_CHUNKS    `{prefix}_weights_chunks`: how many chunks (exported)
 *   KILN_CHECK_COUNT     the number of regions (the data symbols, in blob order)
 *   KILN_CHECK_REGIONS   X(symbol, size) per region
 *   KILN_CHECK_CHUNK     the chunk size in bytes (every region's)
 *   KILN_CHECK_TOTAL     the number of chunks over every region
 *   KILN_CHECK_DIGESTS   the chunks' hashes, region by region, as an initializer
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

#if KILN_CHECK_COUNT > 0
/* The regions' addresses sit in a table (64-bit data relocations): gigabytes of
   weights may lie beyond what a PC-relative reference in the code reaches. */
#define KILN_CHECK_DECLARE(symbol, size) \
  extern __attribute__((visibility("hidden"))) const uint8_t symbol[];
#define X KILN_CHECK_DECLARE
KILN_CHECK_REGIONS
#undef X
typedef struct {
  const uint8_t *base;
  uint64_t size;
} KilnCheckRegion;
#define KILN_CHECK_ROW(symbol, size) {symbol, size},
#define X KILN_CHECK_ROW
static const KilnCheckRegion kiln_check_regions[KILN_CHECK_COUNT] = {KILN_CHECK_REGIONS};
#undef X
static const uint64_t kiln_check_digests[KILN_CHECK_TOTAL] = KILN_CHECK_DIGESTS;
#endif

/* How many chunks {prefix}_check_weights counts over. */
__attribute__((visibility("default"))) int64_t KILN_CHECK_CHUNKS(void) {
#if KILN_CHECK_COUNT > 0
  return KILN_CHECK_TOTAL;
#else
  return 0;
#endif
}

/* Check chunks [first, first + count) against the table: -1 if they match, the
   index of the first damaged chunk otherwise, -2 for a range out of bounds.
   External weights must be mapped first ({prefix}_map_weights). */
__attribute__((visibility("default"))) int64_t KILN_CHECK_WEIGHTS(int64_t first, int64_t count) {
  if (first < 0 || count < 0 || first > KILN_CHECK_CHUNKS() - count) return -2;
#if KILN_CHECK_COUNT > 0
  int64_t index = 0;
  for (int r = 0; r < KILN_CHECK_COUNT; r++) {
    const KilnCheckRegion *region = &kiln_check_regions[r];
    /* Read through a volatile: the compiler must not fold the address into a
       PC-relative reference to the symbol (see the table above). */
    const uint8_t *base = *(const uint8_t *const volatile *)&region->base;
    uint64_t chunks = (region->size + KILN_CHECK_CHUNK - 1) / KILN_CHECK_CHUNK;
    for (uint64_t k = 0; k < chunks; k++, index++) {
      if (index < first || index >= first + count) continue;
      uint64_t start = k * KILN_CHECK_CHUNK;
      uint64_t length = region->size - start < KILN_CHECK_CHUNK ? region->size - start
                                                                 : KILN_CHECK_CHUNK;
      if (KILN_CHECK_HASH(base + start, length) != kiln_check_digests[index])
        return index;
    }
  }
#endif
  return -1;
}
