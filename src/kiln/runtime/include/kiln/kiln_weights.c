/*
 * kiln_weights.c -- the part of a library exported with weights="external" that
 * maps its weights file (docs/runtime.md "External weights", docs/format.md
 * "The weights file").
 *
 * The kernels address the weights as `{prefix}_consts + offset`, a hidden symbol
 * of the library. With external weights that symbol is a page-aligned region of
 * .bss (no bytes in the file), whose pages nothing else shares; it is made
 * inaccessible when the library is loaded (a call before the weights are mapped
 * faults instead of computing on zeros), and `{prefix}_map_weights` maps the
 * file's tensors over it, read-only and private (mmap MAP_FIXED): zero-copy, the
 * pages are the file's page cache, shared by every library mapping the file.
 *
 * export_library writes a few #defines, then this file verbatim:
 *   KILN_WEIGHTS_MAP     `{prefix}_map_weights` (exported)
 *   KILN_WEIGHTS_MAP_FD  `{prefix}_map_weights_fd` (exported)
 *   KILN_WEIGHTS_MAP_RANGE `{prefix}_map_weights_range` (exported)
 *   KILN_WEIGHTS_HASH    the 32 bytes of the file's content hash, as an initializer
 *   KILN_WEIGHTS_COUNT   the number of tensors
 *   KILN_WEIGHTS_REGIONS X(symbol, size, reserved) per tensor, in file order
 *   KILN_WEIGHTS_ALIGN   the regions' alignment (a multiple of every page size)
 *   KILN_WEIGHTS_LARGE   (optional) the weights are large: see KILN_WEIGHTS_SECTION
 *
 * The C side checks the header's magic, version, size, tensor sizes and content
 * hash against the library's; it does not hash the data (the Python loader does,
 * lazily, and so can a C host with the index's chunk SHA-256s).
 */
#define _POSIX_C_SOURCE 200809L /* pread, mmap, fstat (not in ISO C) */
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* KILN_WEIGHTS_LARGE (defined for weights past 1 GiB): on x86-64 the regions go to a
   large-data section (.lbss, SHF_X86_64_LARGE), which the linker places after every
   other section, so gigabytes of weights leave the code and the small data within the
   +-2 GiB a 32-bit PC-relative reference reaches. */
#if defined(KILN_WEIGHTS_LARGE) && defined(__x86_64__)
#define KILN_WEIGHTS_SECTION __attribute__((section(".lbss.kiln_weights")))
#else
#define KILN_WEIGHTS_SECTION
#endif
#define KILN_WEIGHTS_DEFINE(symbol, size, reserved) \
  __attribute__((visibility("hidden"), aligned(KILN_WEIGHTS_ALIGN))) KILN_WEIGHTS_SECTION \
  uint8_t symbol[reserved];
#define X KILN_WEIGHTS_DEFINE
KILN_WEIGHTS_REGIONS
#undef X

typedef struct {
  uint8_t *base;
  uint64_t size;
  uint64_t reserved;
} KilnWeightsRegion;

#define KILN_WEIGHTS_ROW(symbol, size, reserved) {symbol, size, reserved},
#define X KILN_WEIGHTS_ROW
static const KilnWeightsRegion kiln_weights_regions[KILN_WEIGHTS_COUNT] = {KILN_WEIGHTS_REGIONS};
#undef X

static const uint8_t kiln_weights_hash[32] = KILN_WEIGHTS_HASH;

/* Return codes of the map entries (docs/runtime.md). */
#define KILN_WEIGHTS_OK 0
#define KILN_WEIGHTS_EOPEN (-1)     /* the file cannot be opened or read */
#define KILN_WEIGHTS_EFORMAT (-2)   /* not a kiln weights file, or another version */
#define KILN_WEIGHTS_EHASH (-3)     /* another content: not this library's weights */
#define KILN_WEIGHTS_ESIZE (-4)     /* truncated, or tensors of other sizes/places */
#define KILN_WEIGHTS_EMAP (-5)      /* mmap failed */

/* Weights not mapped yet: their pages fault rather than read as zeros. */
__attribute__((constructor)) static void kiln_weights_guard(void) {
  for (int i = 0; i < KILN_WEIGHTS_COUNT; i++) {
    if (kiln_weights_regions[i].reserved)
      mprotect(kiln_weights_regions[i].base, kiln_weights_regions[i].reserved, PROT_NONE);
  }
}

static uint64_t kiln_weights_u64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

static uint32_t kiln_weights_u32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Check the header of `fd` against this library; fill offsets[]. */
static int32_t kiln_weights_check(int fd, uint64_t *offsets) {
  uint8_t head[72];
  struct stat st;
  if (fstat(fd, &st) != 0 || pread(fd, head, sizeof head, 0) != (ssize_t)sizeof head)
    return KILN_WEIGHTS_EOPEN;
  if (memcmp(head, "KILNWTS\0", 8) != 0 || kiln_weights_u32(head + 8) != 1)
    return KILN_WEIGHTS_EFORMAT;
  if (memcmp(head + 40, kiln_weights_hash, 32) != 0) return KILN_WEIGHTS_EHASH;
  uint64_t file_size = kiln_weights_u64(head + 16);
  if (kiln_weights_u32(head + 12) != KILN_WEIGHTS_COUNT || file_size != (uint64_t)st.st_size)
    return KILN_WEIGHTS_ESIZE;
  long page = sysconf(_SC_PAGESIZE);
  for (int i = 0; i < KILN_WEIGHTS_COUNT; i++) {
    uint8_t entry[16];
    if (pread(fd, entry, 16, 72 + 16 * (off_t)i) != 16) return KILN_WEIGHTS_EOPEN;
    offsets[i] = kiln_weights_u64(entry);
    uint64_t size = kiln_weights_u64(entry + 8);
    if (size != kiln_weights_regions[i].size || offsets[i] % (uint64_t)page != 0 ||
        offsets[i] + size > file_size)
      return KILN_WEIGHTS_ESIZE;
  }
  return KILN_WEIGHTS_OK;
}

/* Map the weights file open as `fd` (which the caller may close afterwards). */
__attribute__((visibility("default"))) int32_t KILN_WEIGHTS_MAP_FD(int32_t fd) {
  uint64_t offsets[KILN_WEIGHTS_COUNT + 1];
  int32_t rc = kiln_weights_check(fd, offsets);
  if (rc != KILN_WEIGHTS_OK) return rc;
  uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
  for (int i = 0; i < KILN_WEIGHTS_COUNT; i++) {
    const KilnWeightsRegion *r = &kiln_weights_regions[i];
    if (!r->size) continue;
    size_t length = (size_t)((r->size + page - 1) / page * page);
    void *at = mmap(r->base, length, PROT_READ, MAP_PRIVATE | MAP_FIXED, fd,
                    (off_t)offsets[i]);
    if (at == MAP_FAILED) return KILN_WEIGHTS_EMAP;
  }
  return KILN_WEIGHTS_OK;
}

/* Map the weights file at `path`. */
__attribute__((visibility("default"))) int32_t KILN_WEIGHTS_MAP(const char *path) {
  int fd = open(path, O_RDONLY);
  if (fd < 0) return KILN_WEIGHTS_EOPEN;
  int32_t rc = KILN_WEIGHTS_MAP_FD(fd);
  close(fd);
  return rc;
}

/* Map bytes [start, start + length) of tensor `tensor`'s region from `fd` at `offset`
   (another weights file whose bytes there equal this library's: the loader checked
   their chunk hashes), so that libraries of one model whose weights differ in a few
   arrays share the pages of the rest (docs/runtime.md "One copy per process"). `start`
   and `offset` are page-aligned, and the range ends on a page or at the tensor's end
   (the page's tail past it is the region's padding); any other range is refused. */
__attribute__((visibility("default"))) int32_t KILN_WEIGHTS_MAP_RANGE(
    int32_t fd, int32_t tensor, uint64_t start, uint64_t length, uint64_t offset) {
  uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
  if (tensor < 0 || tensor >= KILN_WEIGHTS_COUNT) return KILN_WEIGHTS_ESIZE;
  const KilnWeightsRegion *r = &kiln_weights_regions[tensor];
  if (start % page != 0 || offset % page != 0 || length == 0 || start > r->size ||
      length > r->size - start || ((start + length) % page != 0 && start + length != r->size))
    return KILN_WEIGHTS_ESIZE;
  void *at = mmap(r->base + start, (size_t)((length + page - 1) / page * page), PROT_READ,
                  MAP_PRIVATE | MAP_FIXED, fd, (off_t)offset);
  return at == MAP_FAILED ? KILN_WEIGHTS_EMAP : KILN_WEIGHTS_OK;
}
