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
 *   KILN_CHECK_REHASH    `{prefix}_rehash_weights`: the table follows a swap (exported)
 *   KILN_CHECK_REWRITTEN `{prefix}_check_rewritten`: the same, hidden (for the library's
 *                        own swap, kiln_swap_run.c, which no other library can interpose)
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
/* Written at export; a chunk that the library's own swap rewrote gets its new hash
   (KILN_CHECK_REWRITTEN), so a host that checks after swapping is not refused and a
   byte damaged after the swap is still found. Words are read and written atomically
   (where 64-bit words are lock-free): a check beside a swap sees a chunk's old or new
   hash. */
static uint64_t kiln_check_digests[KILN_CHECK_TOTAL] = KILN_CHECK_DIGESTS;
#if defined(__GCC_ATOMIC_LLONG_LOCK_FREE) && __GCC_ATOMIC_LLONG_LOCK_FREE == 2
#define KILN_CHECK_LOAD(p) __atomic_load_n(p, __ATOMIC_RELAXED)
#define KILN_CHECK_STORE(p, v) __atomic_store_n(p, v, __ATOMIC_RELAXED)
#else /* no lock-free 64-bit words (libatomic): a check beside a swap may see a torn one */
#define KILN_CHECK_LOAD(p) (*(const volatile uint64_t *)(p))
#define KILN_CHECK_STORE(p, v) (*(volatile uint64_t *)(p) = (v))
#endif
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
      if (KILN_CHECK_HASH(base + start, length) != KILN_CHECK_LOAD(&kiln_check_digests[index]))
        return index;
    }
  }
#endif
  return -1;
}

/* A swap of the library's own ({prefix}_swap_weights, kiln_swap_run.c; or the Python
   loader's numpy path, kiln.runtime.swap) rewrites [data, data + size) of the weights.
   Phase 0, before it writes: note which chunks the range touches are intact. Phase 1,
   after: hash the noted ones again into the table. A chunk damaged before the swap keeps
   its old hash, so the damage is still found (the swap may rewrite only part of a
   chunk). Returns how many chunks phase 1 hashed again (0 for phase 0), -2 when the
   bytes are not all inside the weights or the phase is neither (nothing noted or
   changed). Only for bytes the library installs: the check exists to find the bytes
   nobody meant to change. One swap at a time (the caller's call guard). */
#if KILN_CHECK_COUNT > 0
static uint8_t kiln_check_noted[KILN_CHECK_TOTAL];

/* The part of [lo, hi) inside `region`, as [*a, *b) from its start; 0 when none. */
static int kiln_check_overlap(const KilnCheckRegion *region, uintptr_t lo, uintptr_t hi,
                              uint64_t *a, uint64_t *b) {
  uintptr_t from = (uintptr_t) * (const uint8_t *const volatile *)&region->base;
  uintptr_t to = from + region->size;
  if (lo >= to || hi <= from) return 0;
  *a = (lo > from ? lo : from) - from;
  *b = (hi < to ? hi : to) - from;
  return 1;
}
#endif

__attribute__((visibility("hidden"))) int64_t KILN_CHECK_REWRITTEN(const void *data,
                                                                  uint64_t size,
                                                                  int32_t phase) {
#if KILN_CHECK_COUNT > 0
  uintptr_t lo = (uintptr_t)data, hi = lo + size;
  uint64_t covered = 0, a, b, k;
  int64_t index = 0, done = 0;
  int r;
  if (hi < lo || (phase != 0 && phase != 1)) return -2;
  for (r = 0; r < KILN_CHECK_COUNT; r++)
    if (kiln_check_overlap(&kiln_check_regions[r], lo, hi, &a, &b)) covered += b - a;
  if (covered != size) return -2;
  for (r = 0; r < KILN_CHECK_COUNT; r++) {
    const KilnCheckRegion *region = &kiln_check_regions[r];
    const uint8_t *base = *(const uint8_t *const volatile *)&region->base;
    if (size > 0 && kiln_check_overlap(region, lo, hi, &a, &b)) {
      for (k = a / KILN_CHECK_CHUNK; k <= (b - 1) / KILN_CHECK_CHUNK; k++) {
        int64_t i = index + (int64_t)k;
        uint64_t start = k * KILN_CHECK_CHUNK;
        uint64_t length = region->size - start < KILN_CHECK_CHUNK ? region->size - start
                                                                   : KILN_CHECK_CHUNK;
        if (phase == 0) {
          kiln_check_noted[i] =
              KILN_CHECK_HASH(base + start, length) == KILN_CHECK_LOAD(&kiln_check_digests[i]);
        } else if (kiln_check_noted[i]) {
          KILN_CHECK_STORE(&kiln_check_digests[i], KILN_CHECK_HASH(base + start, length));
          kiln_check_noted[i] = 0;
          done++;
        }
      }
    }
    index += (int64_t)((region->size + KILN_CHECK_CHUNK - 1) / KILN_CHECK_CHUNK);
  }
  return done;
#else
  (void)data;
  return size == 0 && (phase == 0 || phase == 1) ? 0 : -2;
#endif
}

/* KILN_CHECK_REWRITTEN for hosts and the Python loader (docs/runtime.md, "Swapping
   weights"). */
__attribute__((visibility("default"))) int64_t KILN_CHECK_REHASH(const void *data,
                                                                uint64_t size, int32_t phase) {
  return KILN_CHECK_REWRITTEN(data, size, phase);
}
