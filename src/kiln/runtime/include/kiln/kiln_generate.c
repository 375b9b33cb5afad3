/* ------------------------------------------------------- greedy generation
   kiln_host.c's part for `{prefix}_generate_{fn}` (docs/abi.md, "Generation"): the loop of
   kiln.generate, greedy, over a decoder function with a key/value cache. host.c describes
   the function's roles in a kiln_host_decoder (kiln.codegen.host_generate) and defines
   KILN_HOST_GENERATE. The prompt runs as one call from an empty cache, then one token a
   row per call; each call's presents become the next call's pasts, with the shapes the
   call gave them (a present whose cached length is a run-time dimension, as
   GroupQueryAttention's total_sequence_length, has its actual length written back by the
   packed entry, docs/abi.md "Data-dependent output sizes"); a row that produced a stop
   token continues with the pad token, and the loop ends when every row has.
   The cache is allocated once per generation, at its largest (prompt + max_new positions):
   two buffers per past, the call writing its present into the one its past is not in,
   then the two swapped; the other results' buffers are kept from call to call too (grown
   when their size changes), so a decode step allocates nothing.
   A decoder whose presents are each written in place of their past (`shared`,
   GroupQueryAttention's shared buffer, docs/abi.md "A result in place of a parameter")
   has one zeroed buffer per past instead, at a fixed cache length (the prompt and up to
   KILN_HOST_GEN_SHARED_STEPS new positions, doubled when full): each call gets the past
   at that length, the mask the positions cached, and writes its new rows in place, as
   kiln.generate's Python loop does.
   A decoder with a companion that computes only each row's last logits (library metadata
   "last_position", kiln.transform.last_position) runs the prompt's call on it
   (`prompt_call`, `prompt_shapes`): its logits are [batch, 1, vocab], its presents the
   decoder's. */
#if defined(KILN_HOST_GENERATE)
#include <stdlib.h>

typedef int32_t (*kiln_host_packed_fn)(const KilnValue* args, const int32_t* type_codes,
    int32_t num_args);
typedef int32_t (*kiln_host_shapes_fn)(const KilnValue* args, const int32_t* type_codes,
    int32_t num_args, int64_t* shapes);
/* kiln.h's KilnTokenFunc: step `step`'s tokens, one per row; nonzero ends the loop. */
typedef int32_t (*kiln_host_token_fn)(const int64_t* tokens, int64_t batch, int64_t step,
    void* user);

/* The most dimensions of a decoder's argument, and what a parameter's dimension is
   when it is not a fixed size (kiln_host_decoder.dims). */
#define KILN_HOST_GEN_RANK 8
/* The most dimensions of all a decoder's results together. */
#define KILN_HOST_GEN_RESULT_DIMS 1024
/* The new positions a shared cache holds at first. */
#define KILN_HOST_GEN_SHARED_STEPS 256
enum {
  KILN_HOST_GEN_BATCH = -1,   /* the prompt's rows */
  KILN_HOST_GEN_CACHED = -2,  /* the positions cached before this call */
  KILN_HOST_GEN_NEW = -3,     /* this call's new positions (the prompt, then 1) */
  KILN_HOST_GEN_TOTAL = -4    /* cached + new (an attention mask's length) */
};

typedef struct {
  const char* name;           /* the function, for messages */
  kiln_host_packed_fn call;
  kiln_host_shapes_fn shapes;
  int32_t n_params, n_results;
  const DLDataType* dtypes;   /* the parameters', then the results' */
  const int32_t* ranks;       /* likewise */
  const int64_t* dims;        /* KILN_HOST_GEN_RANK per parameter: a size or a GEN code */
  int32_t ids, mask, positions, cache_position;  /* parameter indices, -1 if absent */
  int32_t logits;             /* a result index: float32 [batch, new, vocab] */
  int32_t n_pasts;
  const int32_t* pasts;       /* parameter indices */
  const int32_t* presents;    /* result indices, in the pasts' order */
  int32_t shared;             /* 1: each present is written in place of its past */
  kiln_host_packed_fn prompt_call;   /* the prompt's call (the companion), or NULL: call */
  kiln_host_shapes_fn prompt_shapes; /* likewise for shapes */
} kiln_host_decoder;

/* The bytes of a tensor of `shape`, or -1 when they overflow size_t. */
static int64_t kiln_host_gen_bytes(const int64_t* shape, int32_t rank, DLDataType t) {
  int64_t n = (int64_t)((t.bits + 7) / 8);
  int32_t d;
  for (d = 0; d < rank; ++d) {
    if (shape[d] < 0 || (shape[d] != 0 && n > INT64_MAX / shape[d])) {
      return -1;
    }
    n *= shape[d];
  }
  return n;
}

/* A buffer of `bytes` (at least one byte: an empty tensor still has an address). */
static void* kiln_host_gen_alloc(int64_t bytes) {
  if (bytes < 0 || (uint64_t)bytes > (uint64_t)SIZE_MAX) {
    return NULL;
  }
  return malloc(bytes > 0 ? (size_t)bytes : 1);
}

/* Element `i` of an int32 or int64 tensor. */
static void kiln_host_gen_put(void* data, DLDataType t, int64_t i, int64_t v) {
  if (t.bits == 32) {
    ((int32_t*)data)[i] = (int32_t)v;
  } else {
    ((int64_t*)data)[i] = v;
  }
}

/* The index of the largest of `n` floats: the first one on a tie, and the first NaN if
   there is one, as numpy.argmax. */
static int64_t kiln_host_gen_argmax(const float* row, int64_t n) {
  int64_t best = 0, i;
  if (row[0] != row[0]) {
    return 0;
  }
  for (i = 1; i < n; ++i) {
    if (row[i] != row[i]) {
      return i;
    }
    if (row[i] > row[best]) {
      best = i;
    }
  }
  return best;
}

/* The state of one generation: every buffer it owns, freed by kiln_host_gen_free. */
typedef struct {
  KilnValue* args;
  int32_t* codes;
  DLTensor* tensors;
  int64_t* shapes;            /* KILN_HOST_GEN_RANK per argument */
  void** data;                /* each argument's buffer (the pasts' live in `past`) */
  void** past;                /* the cache, one buffer per past */
  void** spare;               /* each past's second buffer: the next present's */
  int64_t* past_bytes;        /* the size of each past's buffer */
  int64_t* spare_bytes;       /* likewise of its second buffer */
  int64_t* result_bytes;      /* each result buffer's size (s->data[n_params + j]) */
  int64_t* past_shapes;       /* KILN_HOST_GEN_RANK per past: its shape in the next call */
  int64_t length;             /* a shared cache's positions (d->shared) */
  int64_t* step_ids;          /* [batch, new] this call's token ids */
  unsigned char* finished;
} kiln_host_gen_state;

/* The parameters' buffers of a call (the results' stay for the next one). */
static void kiln_host_gen_free_args(const kiln_host_decoder* d, kiln_host_gen_state* s) {
  int32_t i;
  for (i = 0; i < d->n_params; ++i) {
    free(s->data[i]);
    s->data[i] = NULL;
  }
}

/* The past whose present result `j` is, or -1 (a present's buffer is the cache's, not
   s->data's). */
static int32_t kiln_host_gen_present_of(const kiln_host_decoder* d, int32_t j) {
  int32_t p;
  for (p = 0; p < d->n_pasts; ++p) {
    if (d->presents[p] == j) {
      return p;
    }
  }
  return -1;
}

static void kiln_host_gen_free(const kiln_host_decoder* d, kiln_host_gen_state* s) {
  int32_t i;
  for (i = 0; s->data != NULL && i < d->n_params + d->n_results; ++i) {
    free(s->data[i]);  /* NULL for the presents: their buffers are the cache's */
  }
  for (i = 0; s->past != NULL && s->spare != NULL && i < d->n_pasts; ++i) {
    free(s->past[i]);
    free(s->spare[i]);
  }
  free(s->args);
  free(s->codes);
  free(s->tensors);
  free(s->shapes);
  free(s->data);
  free(s->past);
  free(s->spare);
  free(s->past_bytes);
  free(s->spare_bytes);
  free(s->result_bytes);
  free(s->past_shapes);
  free(s->step_ids);
  free(s->finished);
}

static void kiln_host_gen_tensor(kiln_host_gen_state* s, int32_t i, void* data, int32_t rank,
    DLDataType t) {
  DLTensor* x = &s->tensors[i];
  x->data = data;
  x->device.device_type = KILN_DEVICE_CPU;
  x->device.device_id = 0;
  x->ndim = rank;
  x->dtype = t;
  x->shape = s->shapes + (int64_t)i * KILN_HOST_GEN_RANK;
  x->strides = NULL;
  x->byte_offset = 0;
  s->args[i].v_handle = x;
  s->codes[i] = KILN_ARG_DLTENSOR;
}

/* Parameter `i`'s shape from the decoder's codes for a call of `new` positions after
   `cached` ones. */
static void kiln_host_gen_shape(const kiln_host_decoder* d, int32_t i, int64_t batch,
    int64_t cached, int64_t step_new, int64_t* shape) {
  int32_t dim;
  for (dim = 0; dim < d->ranks[i]; ++dim) {
    int64_t code = d->dims[(int64_t)i * KILN_HOST_GEN_RANK + dim];
    shape[dim] = code >= 0 ? code : code == KILN_HOST_GEN_BATCH ? batch
        : code == KILN_HOST_GEN_CACHED ? cached : code == KILN_HOST_GEN_NEW ? step_new
        : cached + step_new;
  }
}

/* Parameter `i`'s tensor for a call of `new` positions after `cached` ones: a past is
   the cache with the shape its present had (s->past_shapes), any other parameter a new
   buffer of its role with its shape from the decoder's codes. */
static int32_t kiln_host_gen_param(const kiln_host_decoder* d, kiln_host_gen_state* s,
    int32_t i, int64_t batch, int64_t cached, int64_t step_new) {
  int64_t* shape = s->shapes + (int64_t)i * KILN_HOST_GEN_RANK;
  int64_t bytes, r, j, rows, k;
  int32_t p;
  void* data;
  for (p = 0; p < d->n_pasts; ++p) {
    if (d->pasts[p] == i) {
      memcpy(shape, s->past_shapes + (int64_t)p * KILN_HOST_GEN_RANK,
          KILN_HOST_GEN_RANK * sizeof *shape);
      kiln_host_gen_tensor(s, i, s->past[p], d->ranks[i], d->dtypes[i]);
      return 0;
    }
  }
  kiln_host_gen_shape(d, i, batch, cached, step_new, shape);
  bytes = kiln_host_gen_bytes(shape, d->ranks[i], d->dtypes[i]);
  data = s->data[i] = kiln_host_gen_alloc(bytes);
  if (data == NULL) {
    return kiln_host_fail("%s: generate: out of memory for an input of %lld bytes", d->name,
        (long long)bytes);
  }
  rows = d->ranks[i] == 2 ? shape[0] : 1;
  k = d->ranks[i] == 0 ? 1 : shape[d->ranks[i] - 1];
  for (r = 0; r < rows; ++r) {
    for (j = 0; j < k; ++j) {
      int64_t v = i == d->ids ? s->step_ids[r * step_new + j] : i == d->mask ? 1 : cached + j;
      kiln_host_gen_put(data, d->dtypes[i], r * k + j, v);
    }
  }
  kiln_host_gen_tensor(s, i, data, d->ranks[i], d->dtypes[i]);
  return 0;
}

/* One call of the decoder for `new` positions after `cached`; on success the results'
   buffers are in s->data[n_params + j]. */
static int32_t kiln_host_gen_call(const kiln_host_decoder* d, kiln_host_gen_state* s,
    int64_t batch, int64_t cached, int64_t step_new) {
  int64_t flat[KILN_HOST_GEN_RESULT_DIMS], offset = 0, bytes;
  int32_t i, p, status;
  /* the prompt's call (nothing cached yet) on the companion, when there is one */
  int32_t prompt = cached == 0 && d->prompt_call != NULL;
  for (i = d->n_params; i < d->n_params + d->n_results; ++i) {
    offset += d->ranks[i];
  }
  if (offset > KILN_HOST_GEN_RESULT_DIMS) {
    return kiln_host_fail("%s: generate: the results have %lld dimensions, over %d", d->name,
        (long long)offset, KILN_HOST_GEN_RESULT_DIMS);
  }
  offset = 0;
  for (i = 0; i < d->n_params; ++i) {
    status = kiln_host_gen_param(d, s, i, batch, cached, step_new);
    if (status != 0) {
      return status;
    }
  }
  status = (prompt ? d->prompt_shapes : d->shapes)(s->args, s->codes, d->n_params, flat);
  if (status != 0) {
    return status;
  }
  for (i = d->n_params; i < d->n_params + d->n_results; ++i) {
    int32_t p = kiln_host_gen_present_of(d, i - d->n_params);
    void** buffer = p < 0 ? &s->data[i] : d->shared ? &s->past[p] : &s->spare[p];
    int64_t* size = p < 0 ? &s->result_bytes[i - d->n_params]
        : d->shared ? &s->past_bytes[p] : &s->spare_bytes[p];
    memcpy(s->shapes + (int64_t)i * KILN_HOST_GEN_RANK, flat + offset,
        (size_t)d->ranks[i] * sizeof(int64_t));
    offset += d->ranks[i];
    bytes = kiln_host_gen_bytes(s->shapes + (int64_t)i * KILN_HOST_GEN_RANK, d->ranks[i],
        d->dtypes[i]);
    /* A present's buffer holds the longest cache; any other result's is replaced when its
       size changes (the prompt's logits are not kept through the steps after). */
    if (p >= 0 && d->shared && (bytes < 0 || bytes > *size)) {
      return kiln_host_fail("%s: generate: a present of %lld bytes over its shared cache of "
          "%lld", d->name, (long long)bytes, (long long)*size);
    }
    if (*buffer == NULL || bytes < 0 || (p >= 0 ? bytes > *size : bytes != *size)) {
      free(*buffer);
      *size = bytes;
      if ((*buffer = kiln_host_gen_alloc(bytes)) == NULL) {
        *size = 0;
        return kiln_host_fail("%s: generate: out of memory for a result of %lld bytes",
            d->name, (long long)bytes);
      }
    }
    kiln_host_gen_tensor(s, i, *buffer, d->ranks[i], d->dtypes[i]);
  }
  status = (prompt ? d->prompt_call : d->call)(s->args, s->codes, d->n_params + d->n_results);
  for (p = 0; status == 0 && d->shared && p < d->n_pasts; ++p) {
    i = d->n_params + d->presents[p];  /* in place: the present is the past's shape */
    if (memcmp(s->shapes + (int64_t)i * KILN_HOST_GEN_RANK, s->past_shapes
        + (int64_t)p * KILN_HOST_GEN_RANK, (size_t)d->ranks[i] * sizeof(int64_t)) != 0) {
      return kiln_host_fail("%s: generate: a present written in place came back at another "
          "length than its past's %lld", d->name, (long long)s->length);
    }
  }
  return status;
}

/* After a call: each row's token from its last position's logits, the presents kept as
   the cache with the shapes the call wrote (the actual ones where a run-time dimension
   sizes them; the data is compact for those from the buffer's start). Returns how many
   rows are finished. */
static int64_t kiln_host_gen_choose(const kiln_host_decoder* d, kiln_host_gen_state* s,
    int64_t batch, const int64_t* stops, int32_t n_stop, int64_t pad, int64_t* out,
    int64_t stride) {
  int32_t li = d->n_params + d->logits, p, k;
  const int64_t* ls = s->shapes + (int64_t)li * KILN_HOST_GEN_RANK;
  const float* logits = (const float*)s->data[li];
  int64_t r, done = 0;
  for (r = 0; r < batch; ++r) {
    int64_t token = s->finished[r] ? pad
        : kiln_host_gen_argmax(logits + (r * ls[1] + ls[1] - 1) * ls[2], ls[2]);
    for (k = 0; k < n_stop; ++k) {
      s->finished[r] |= (unsigned char)(token == stops[k]);
    }
    done += s->finished[r];
    out[r * stride] = token;
    s->step_ids[r] = token;
  }
  for (p = 0; !d->shared && p < d->n_pasts; ++p) {  /* the present becomes the past */
    int32_t ri = d->n_params + d->presents[p];
    void* written = s->spare[p];
    int64_t size = s->spare_bytes[p];
    s->spare[p] = s->past[p];
    s->spare_bytes[p] = s->past_bytes[p];
    s->past[p] = written;
    s->past_bytes[p] = size;
    memcpy(s->past_shapes + (int64_t)p * KILN_HOST_GEN_RANK,
        s->shapes + (int64_t)ri * KILN_HOST_GEN_RANK, KILN_HOST_GEN_RANK * sizeof(int64_t));
  }
  return done;
}

/* A shared cache (d->shared) of s->length positions and room for `step_new` more (a
   present's bound), zeroed, with the first `cached` positions of the one before. */
static int32_t kiln_host_gen_shared(const kiln_host_decoder* d, kiln_host_gen_state* s,
    int64_t batch, int64_t cached, int64_t step_new) {
  int32_t p, k, axis;
  for (p = 0; p < d->n_pasts; ++p) {
    int32_t i = d->pasts[p];
    int64_t room[KILN_HOST_GEN_RANK], *shape = s->past_shapes + (int64_t)p * KILN_HOST_GEN_RANK;
    int64_t bytes, outer = 1, inner = (d->dtypes[i].bits + 7) / 8, o;
    unsigned char* grown;
    kiln_host_gen_shape(d, i, batch, s->length + step_new, 0, room);
    bytes = kiln_host_gen_bytes(room, d->ranks[i], d->dtypes[i]);
    grown = bytes < 0 || (uint64_t)bytes > (uint64_t)SIZE_MAX ? NULL
        : (unsigned char*)calloc(bytes > 0 ? (size_t)bytes : 1, 1);
    if (grown == NULL) {
      return kiln_host_fail("%s: generate: out of memory for a cache of %lld bytes", d->name,
          (long long)bytes);
    }
    for (axis = 0; axis < d->ranks[i]
         && d->dims[(int64_t)i * KILN_HOST_GEN_RANK + axis] != KILN_HOST_GEN_CACHED; ++axis) {
      outer *= room[axis];
    }
    for (k = axis + 1; k < d->ranks[i]; ++k) {
      inner *= room[k];
    }
    for (o = 0; s->past[p] != NULL && cached > 0 && o < outer; ++o) {  /* rows kept */
      memcpy(grown + o * s->length * inner,
          (unsigned char*)s->past[p] + o * shape[axis] * inner, (size_t)(cached * inner));
    }
    free(s->past[p]);
    s->past[p] = grown;
    s->past_bytes[p] = bytes;
    kiln_host_gen_shape(d, i, batch, s->length, 0, shape);
  }
  return 0;
}

static int32_t kiln_host_gen_start(const kiln_host_decoder* d, kiln_host_gen_state* s,
    const int64_t* prompt, int64_t batch, int64_t prompt_len, int64_t max_new) {
  size_t n = (size_t)(d->n_params + d->n_results);
  int32_t p;
  memset(s, 0, sizeof *s);
  if ((uint64_t)batch > (uint64_t)SIZE_MAX / sizeof(int64_t) / (uint64_t)prompt_len) {
    return kiln_host_fail("%s: generate: a prompt of %lld x %lld tokens is too large", d->name,
        (long long)batch, (long long)prompt_len);
  }
  s->args = (KilnValue*)calloc(n, sizeof *s->args);
  s->codes = (int32_t*)calloc(n, sizeof *s->codes);
  s->tensors = (DLTensor*)calloc(n, sizeof *s->tensors);
  s->shapes = (int64_t*)calloc(n * KILN_HOST_GEN_RANK, sizeof *s->shapes);
  s->data = (void**)calloc(n, sizeof *s->data);
  s->past = (void**)calloc((size_t)d->n_pasts + 1, sizeof *s->past);
  s->spare = (void**)calloc((size_t)d->n_pasts + 1, sizeof *s->spare);
  s->past_bytes = (int64_t*)calloc((size_t)d->n_pasts + 1, sizeof *s->past_bytes);
  s->spare_bytes = (int64_t*)calloc((size_t)d->n_pasts + 1, sizeof *s->spare_bytes);
  s->result_bytes = (int64_t*)calloc((size_t)d->n_results + 1, sizeof *s->result_bytes);
  s->past_shapes = (int64_t*)calloc(((size_t)d->n_pasts + 1) * KILN_HOST_GEN_RANK,
      sizeof *s->past_shapes);
  s->step_ids = (int64_t*)malloc((size_t)(batch * prompt_len) * sizeof *s->step_ids);
  s->finished = (unsigned char*)calloc((size_t)batch, 1);
  if (!s->args || !s->codes || !s->tensors || !s->shapes || !s->data || !s->past
      || !s->spare || !s->past_bytes || !s->spare_bytes || !s->result_bytes || !s->past_shapes || !s->step_ids
      || !s->finished) {
    return kiln_host_fail("%s: generate: out of memory", d->name);
  }
  if (d->shared) {
    s->length = prompt_len + (max_new < KILN_HOST_GEN_SHARED_STEPS ? max_new
        : KILN_HOST_GEN_SHARED_STEPS);
    memcpy(s->step_ids, prompt, (size_t)(batch * prompt_len) * sizeof *s->step_ids);
    return kiln_host_gen_shared(d, s, batch, 0, prompt_len);
  }
  for (p = 0; p < d->n_pasts; ++p) {
    /* Both buffers at the cache's largest, its pages touched only as the rows are written:
       a past's shape with every position cached (the last present is one shorter). */
    int64_t full[KILN_HOST_GEN_RANK];
    kiln_host_gen_shape(d, d->pasts[p], batch, prompt_len + max_new, 0, full);
    s->past_bytes[p] = kiln_host_gen_bytes(full, d->ranks[d->pasts[p]], d->dtypes[d->pasts[p]]);
    s->spare_bytes[p] = s->past_bytes[p];
    s->past[p] = kiln_host_gen_alloc(s->past_bytes[p]);
    s->spare[p] = kiln_host_gen_alloc(s->past_bytes[p]);
    if (s->past[p] == NULL || s->spare[p] == NULL) {
      /* more than the memory can reserve (a max_new far past where a stop token ends
         it): each call's present then gets a buffer as it grows */
      free(s->past[p]);
      free(s->spare[p]);
      s->past_bytes[p] = s->spare_bytes[p] = 0;
      s->past[p] = kiln_host_gen_alloc(0);
      s->spare[p] = kiln_host_gen_alloc(0);
      if (s->past[p] == NULL || s->spare[p] == NULL) {
        return kiln_host_fail("%s: generate: out of memory", d->name);
      }
    }
    kiln_host_gen_shape(d, d->pasts[p], batch, 0, 0,
        s->past_shapes + (int64_t)p * KILN_HOST_GEN_RANK);
  }
  memcpy(s->step_ids, prompt, (size_t)(batch * prompt_len) * sizeof *s->step_ids);
  return 0;
}

/* Greedy generation (the entry `{prefix}_generate_{fn}`): up to `max_new` tokens after
   each of the `batch` rows of `prompt` ([batch, prompt_len] int64), written to `out`
   ([batch, max_new] int64; *steps the tokens generated per row). `on_token`, if not
   NULL, gets each step's tokens ([batch], valid during the call) after they are written
   to `out`; a nonzero return ends the loop after that step. Returns 0, or the failed
   call's status with its message in `{prefix}_last_error`. */
static KILN_UNUSED int32_t kiln_host_generate(const kiln_host_decoder* d,
    const int64_t* prompt, int64_t batch, int64_t prompt_len, int64_t max_new,
    const int64_t* stops, int32_t n_stop, int64_t pad, int64_t* out, int64_t* steps,
    kiln_host_token_fn on_token, void* user) {
  kiln_host_gen_state s;
  int64_t cached = 0, step_new = prompt_len, step;
  int32_t status;
  if (steps != NULL) {
    *steps = 0;
  }
  if (prompt == NULL || out == NULL || steps == NULL || (n_stop > 0 && stops == NULL)) {
    return kiln_host_fail("%s: generate: prompt, out and steps must not be NULL (nor "
        "stop_tokens when n_stop > 0)", d->name);
  }
  if (batch < 1 || prompt_len < 1 || max_new < 0 || n_stop < 0) {
    return kiln_host_fail("%s: generate: batch %lld and prompt length %lld must be >= 1, "
        "max_new_tokens %lld and n_stop %d >= 0", d->name, (long long)batch,
        (long long)prompt_len, (long long)max_new, (int)n_stop);
  }
  status = kiln_host_gen_start(d, &s, prompt, batch, prompt_len, max_new);
  for (step = 0; status == 0 && step < max_new; ++step) {
    if (d->shared && cached + step_new > s.length) {  /* the shared cache is full */
      s.length = 2 * s.length > cached + step_new ? 2 * s.length : cached + step_new;
      status = kiln_host_gen_shared(d, &s, batch, cached, step_new);
      if (status != 0) {
        break;
      }
    }
    status = kiln_host_gen_call(d, &s, batch, cached, step_new);
    if (status == 0) {
      int64_t done = kiln_host_gen_choose(d, &s, batch, stops, n_stop, pad, out + step,
          max_new);
      kiln_host_gen_free_args(d, &s);
      *steps = step + 1;
      cached += step_new;
      step_new = 1;
      /* s.step_ids holds this step's token of each row (kiln_host_gen_choose). */
      if ((on_token != NULL && on_token(s.step_ids, batch, step, user) != 0) || done == batch) {
        break;
      }
    }
  }
  kiln_host_gen_free(d, &s);
  return status;
}
#endif /* KILN_HOST_GENERATE */
