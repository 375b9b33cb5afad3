/*
 * kiln_check.c -- the check of a library's weights at memory bandwidth, for the
 * Python loader (through ctypes) and for a plain C host alike (docs/runtime.md
 * "The weight check", docs/format.md "The weights check record"): a table of the
 * kiln.lane64 hash (kiln_hash64.c) of each chunk of the weights, and the entries
 * that check chunks against it.
 *
 * export_library writes a few #defines, then this file verbatim:
 *   KILN_CHECK_HASH      `{prefix}_hash64` (kiln_hash64.c)
 *   KILN_CHECK_WEIGHTS   `{prefix}_check_weights`: check chunks (exported)
 *   KILN_CHECK_CHUNKS    `{prefix}_weights_chunks`: how many chunks (exported)
 *   KILN_CHECK_COUNT     the number of regions (the data symbols, in blob order)
 *   KILN_CHECK_REGIONS   X(symbol, size) per region
 *   KILN_CHECK_CHUNK     the chunk size in bytes (every region's)
 *   KILN_CHECK_TOTAL     the number of chunks over every region
 *   KILN_CHECK_DIGESTS   the chunks' hashes, region by region, as an initializer
 */
#include <stdint.h>

__attribute__((visibility("default"))) uint64_t KILN_CHECK_HASH(const void *data, uint64_t n);

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
