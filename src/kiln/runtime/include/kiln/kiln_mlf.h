/* kiln_mlf.h -- the workspace allocator of a kiln Model Library Format archive.
 *
 * A firmware build has no heap: the kernels' temporary buffers come from the
 * caller's workspace through a stack allocator. The functions are named after
 * the model so that several models link into one image: define KILN_MLF_PREFIX
 * (the model name, e.g. -DKILN_MLF_PREFIX=cnn) before including this header and
 * when compiling kiln_mlf.c, which then defines
 *
 *   void  cnn_mlf_reset(void* workspace, size_t size);  start a run on a workspace
 *   void* cnn_mlf_malloc(size_t size);   a KILN_MLF_ALIGN-aligned buffer, or NULL
 *   void  cnn_mlf_free(void* ptr);       freed out of order: popped once all above are
 *
 * The allocator state is static to kiln_mlf.c: one run per model at a time.
 */
#ifndef KILN_MLF_H_
#define KILN_MLF_H_

#include <stddef.h>

#ifndef KILN_MLF_PREFIX
#error "define KILN_MLF_PREFIX to the model name (e.g. -DKILN_MLF_PREFIX=cnn)"
#endif

/* Alignment of every buffer (the workspace itself must be this aligned). */
#ifndef KILN_MLF_ALIGN
#define KILN_MLF_ALIGN 64u
#endif

/* Buffers alive at once: main's arena plus one kernel's. */
#ifndef KILN_MLF_MAX_LIVE_BUFFERS
#define KILN_MLF_MAX_LIVE_BUFFERS 64
#endif

#define KILN_MLF_CAT2_(a, b) a##_##b
#define KILN_MLF_CAT2(a, b) KILN_MLF_CAT2_(a, b)
/* KILN_MLF_NAME(mlf_malloc) -> <prefix>_mlf_malloc */
#define KILN_MLF_NAME(name) KILN_MLF_CAT2(KILN_MLF_PREFIX, name)

#ifdef __cplusplus
extern "C" {
#endif

void KILN_MLF_NAME(mlf_reset)(void* workspace, size_t size);
void* KILN_MLF_NAME(mlf_malloc)(size_t size);
void KILN_MLF_NAME(mlf_free)(void* ptr);

#ifdef __cplusplus
}
#endif

#endif /* KILN_MLF_H_ */
