/* kiln_mlf.c -- the workspace allocator of a kiln Model Library Format archive
 * (interface and naming in kiln_mlf.h). Compiled once per model with
 * -DKILN_MLF_PREFIX=<model>; the generated kernels call it through
 * -DKILN_MALLOC=<model>_mlf_malloc -DKILN_FREE=<model>_mlf_free.
 *
 * The buffers form a stack in the workspace: malloc pushes one (aligned) on top,
 * free marks its entry, and the top pops back past every marked entry, so a
 * buffer freed out of order is reclaimed once everything above it is freed.
 */
#include <stddef.h>
#include <stdint.h>

#include "kiln/kiln_mlf.h"

static uint8_t* arena;
static size_t arena_size, arena_top, depth;
static size_t starts[KILN_MLF_MAX_LIVE_BUFFERS], tops[KILN_MLF_MAX_LIVE_BUFFERS];
static unsigned char freed[KILN_MLF_MAX_LIVE_BUFFERS];

void KILN_MLF_NAME(mlf_reset)(void* workspace, size_t size) {
  arena = (uint8_t*)workspace;
  arena_size = workspace == NULL ? 0 : size;
  arena_top = 0;
  depth = 0;
}

void* KILN_MLF_NAME(mlf_malloc)(size_t size) {
  size_t start = (arena_top + (KILN_MLF_ALIGN - 1u)) & ~(size_t)(KILN_MLF_ALIGN - 1u);
  if (arena == NULL || depth == KILN_MLF_MAX_LIVE_BUFFERS || start > arena_size ||
      size > arena_size - start) {
    return NULL;
  }
  starts[depth] = start;
  tops[depth] = arena_top;
  freed[depth++] = 0;
  arena_top = start + (size ? size : 1u);
  return arena + start;
}

void KILN_MLF_NAME(mlf_free)(void* ptr) {
  size_t i;
  if (ptr == NULL) return;
  for (i = depth; i-- > 0;) {
    if (arena + starts[i] == (uint8_t*)ptr) {
      freed[i] = 1;
      break;
    }
  }
  while (depth > 0 && freed[depth - 1]) {
    arena_top = tops[--depth];
  }
}
