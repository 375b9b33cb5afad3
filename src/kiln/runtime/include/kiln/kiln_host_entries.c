/*
 * kiln_host_entries.c -- the part of host.c's runtime that the model's entries
 * need in their own object (host.c's model part follows it): the messages of the
 * kernels' failed checks (the model's own among them), the call guard and swap
 * of kiln_swap.c and the generation loop of kiln_generate.c. kiln.codegen.host
 * writes it after kiln_host.c and the model's KILN_HOST_CHECK_MESSAGES, so
 * kiln_host.c itself stays the same for every model of one configuration
 * (kiln.runtime.native compiles it once).
 */
/* The message of a kernel's non-zero status (docs/codegen-c.md, "Error codes");
   `workspace_bytes` is 0 when the failed allocation's size is not known. */
#if defined(KILN_HOST_CHECK_MESSAGES)
/* Messages of the kernels' failed checks by status code (0 where a code has none):
   host.c defines the initializer from kiln.ir.kernel_errors. */
static const char* const kiln_host_check_messages[] = KILN_HOST_CHECK_MESSAGES;
#endif

static KILN_UNUSED int32_t kiln_host_kernel_failed(const char* fn, int32_t status,
    long long workspace_bytes) {
  if (status == 1 && workspace_bytes > 0) {
    kiln_host_fail("%s: out of memory allocating a workspace of %lld bytes", fn, workspace_bytes);
  } else if (status == 1) {
    kiln_host_fail("%s: out of memory allocating a workspace", fn);
#if defined(KILN_HOST_CHECK_MESSAGES)
  } else if (status > 1
      && (size_t)status < sizeof kiln_host_check_messages / sizeof kiln_host_check_messages[0]
      && kiln_host_check_messages[status] != 0) {
    kiln_host_fail("%s: %s", fn, kiln_host_check_messages[status]);
#endif
  } else {
    kiln_host_fail("%s: kernel failed with status %d", fn, (int)status);
  }
  return status;
}

#include "kiln_generate.c"

#include "kiln_swap.c"
