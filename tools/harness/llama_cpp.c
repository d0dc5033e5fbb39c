/* qcompile's harness around one ggml_mul_mat on ggml's CPU backend (tools/harness/llama_cpp.py
 * builds it against the ggml it builds, and loads it with ctypes).
 *
 * qc_mm_new quantizes a float32 weight [N rows of K] to a ggml type with ggml's quantizer,
 * places it as llama.cpp places model weights -- in the CPU device's extra buffer type of the
 * given name when that type supports this product (CPU_REPACK: q4_0 and q4_K repacked on AVX2),
 * else in a plain CPU buffer -- and builds the graph y = ggml_mul_mat(W, x): W ne = (K, N), x ne = (K, M) float32,
 * y ne = (N, M) float32, i.e. row-major x [M, K] and y [M, N]. qc_mm_compute runs it with
 * ggml_backend_graph_compute (ggml rounds x to the type's vec_dot_type, q8_0 or q8_K, inside).
 * Every function returns 0 on success; qc_mm_new returns NULL with a one-line reason in err.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"

typedef struct qc_mm {
    enum ggml_type type;
    int64_t k, n, m;
    void *quantized;          /* the weight as ggml_quantize_chunk wrote it: N rows */
    size_t quantized_bytes;
    struct ggml_context *ctx_w, *ctx_xy, *ctx_graph;
    ggml_backend_buffer_t buf_w, buf_xy;
    struct ggml_tensor *w, *x, *y;
    struct ggml_cgraph *graph;
    ggml_backend_t backend;
    const char *buffer_name;
} qc_mm;

void qc_mm_free(qc_mm *mm);

static int type_of(const char *name, enum ggml_type *type) {
    for (int t = 0; t < GGML_TYPE_COUNT; t++) {
        const char *known = ggml_type_name((enum ggml_type) t);
        if (known && strcmp(known, name) == 0) {
            *type = (enum ggml_type) t;
            return 0;
        }
    }
    return 1;
}

static struct ggml_context *tensor_context(size_t tensors) {
    struct ggml_init_params params = {
        .mem_size = tensors * ggml_tensor_overhead() + ggml_graph_overhead(),
        .mem_buffer = NULL,
        .no_alloc = true,
    };
    return ggml_init(params);
}

/* Does the CPU device run mul_mat(W, x) with W in buffer type buft? Asked as llama.cpp asks it:
 * on a dummy product whose W sits in an empty buffer of that type. */
static bool product_supported(ggml_backend_dev_t dev, ggml_backend_buffer_type_t buft,
                              enum ggml_type type, int64_t k, int64_t n, int64_t m) {
    struct ggml_context *ctx = tensor_context(4);
    if (!ctx) {
        return false;
    }
    struct ggml_tensor *w = ggml_new_tensor_2d(ctx, type, k, n);
    struct ggml_tensor *x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, k, m);
    struct ggml_tensor *y = ggml_mul_mat(ctx, w, x);
    ggml_backend_buffer_t empty = ggml_backend_buft_alloc_buffer(buft, 0);
    w->buffer = empty;
    bool supported = empty && ggml_backend_dev_supports_op(dev, y);
    w->buffer = NULL;
    if (empty) {
        ggml_backend_buffer_free(empty);
    }
    ggml_free(ctx);
    return supported;
}

/* The extra buffer type named extra (e.g. CPU_REPACK) when the CPU device has it and it supports
 * this product, else the plain CPU buffer type. */
static ggml_backend_buffer_type_t weight_buffer_type(enum ggml_type type, int64_t k, int64_t n,
                                                     int64_t m, const char *extra) {
    ggml_backend_reg_t reg = ggml_backend_cpu_reg();
    ggml_backend_dev_t dev = ggml_backend_reg_dev_get(reg, 0);
    ggml_backend_dev_get_extra_bufts_t extra_bufts = (ggml_backend_dev_get_extra_bufts_t)
        ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts");
    if (extra && *extra && extra_bufts) {
        for (ggml_backend_buffer_type_t *buft = extra_bufts(dev); buft && *buft; buft++) {
            if (strcmp(ggml_backend_buft_name(*buft), extra) == 0 &&
                product_supported(dev, *buft, type, k, n, m)) {
                return *buft;
            }
        }
    }
    return ggml_backend_cpu_buffer_type();
}

/* ggml's warnings and errors to stderr; its info lines (one per repacked tensor) dropped */
static void quiet_log(enum ggml_log_level level, const char *text, void *user_data) {
    (void) user_data;
    if (level == GGML_LOG_LEVEL_WARN || level == GGML_LOG_LEVEL_ERROR) {
        fputs(text, stderr);
    }
}

qc_mm *qc_mm_new(const char *type_name, int64_t k, int64_t n, int64_t m, const float *weight,
                 const char *extra, int threads, char *err, size_t err_len) {
    enum ggml_type type;
    ggml_log_set(quiet_log, NULL);
    if (type_of(type_name, &type)) {
        snprintf(err, err_len, "ggml knows no type %s", type_name);
        return NULL;
    }
    if (k <= 0 || n <= 0 || m <= 0) {
        snprintf(err, err_len, "K=%lld, N=%lld, M=%lld must all be positive",
                 (long long) k, (long long) n, (long long) m);
        return NULL;
    }
    if (k % ggml_blck_size(type)) {
        snprintf(err, err_len, "K=%lld must be a multiple of %lld for %s", (long long) k,
                 (long long) ggml_blck_size(type), type_name);
        return NULL;
    }
    if (!ggml_get_type_traits(type)->to_float || ggml_quantize_requires_imatrix(type)) {
        snprintf(err, err_len, "%s cannot be quantized without an importance matrix here",
                 type_name);
        return NULL;
    }
    qc_mm *mm = calloc(1, sizeof(qc_mm));
    if (!mm) {
        snprintf(err, err_len, "out of memory");
        return NULL;
    }
    mm->type = type;
    mm->k = k;
    mm->n = n;
    mm->m = m;
    mm->quantized_bytes = ggml_row_size(type, k) * (size_t) n;
    mm->quantized = malloc(mm->quantized_bytes);
    mm->backend = ggml_backend_cpu_init();
    mm->ctx_w = tensor_context(1);
    mm->ctx_xy = tensor_context(2);
    mm->ctx_graph = tensor_context(0);
    if (!mm->quantized || !mm->backend || !mm->ctx_w || !mm->ctx_xy || !mm->ctx_graph) {
        snprintf(err, err_len, "out of memory (weight of %zu bytes)", mm->quantized_bytes);
        qc_mm_free(mm);
        return NULL;
    }
    ggml_backend_cpu_set_n_threads(mm->backend, threads);
    ggml_quantize_chunk(type, weight, mm->quantized, 0, n, k, NULL);

    ggml_backend_buffer_type_t buft = weight_buffer_type(type, k, n, m, extra);
    mm->buffer_name = ggml_backend_buft_name(buft);
    mm->w = ggml_new_tensor_2d(mm->ctx_w, type, k, n);
    ggml_set_name(mm->w, "W");
    mm->buf_w = ggml_backend_alloc_ctx_tensors_from_buft(mm->ctx_w, buft);
    mm->x = ggml_new_tensor_2d(mm->ctx_xy, GGML_TYPE_F32, k, m);
    ggml_set_name(mm->x, "x");
    mm->y = ggml_mul_mat(mm->ctx_xy, mm->w, mm->x);
    ggml_set_name(mm->y, "y");
    mm->buf_xy = ggml_backend_alloc_ctx_tensors_from_buft(mm->ctx_xy,
                                                          ggml_backend_cpu_buffer_type());
    if (!mm->buf_w || !mm->buf_xy) {
        snprintf(err, err_len, "ggml could not allocate its buffers (%s)", mm->buffer_name);
        qc_mm_free(mm);
        return NULL;
    }
    /* a repack buffer rearranges the blocks here, once, as llama.cpp's model loader does */
    ggml_backend_tensor_set(mm->w, mm->quantized, 0, mm->quantized_bytes);
    mm->graph = ggml_new_graph(mm->ctx_graph);
    ggml_build_forward_expand(mm->graph, mm->y);
    return mm;
}

int qc_mm_set_x(qc_mm *mm, const float *x) {
    ggml_backend_tensor_set(mm->x, x, 0, ggml_nbytes(mm->x));
    return 0;
}

void qc_mm_set_threads(qc_mm *mm, int threads) {
    ggml_backend_cpu_set_n_threads(mm->backend, threads);
}

int qc_mm_compute(qc_mm *mm) {
    return (int) ggml_backend_graph_compute(mm->backend, mm->graph);
}

int qc_mm_output(qc_mm *mm, float *y) {
    ggml_backend_tensor_get(mm->y, y, 0, ggml_nbytes(mm->y));
    return 0;
}

int qc_mm_dequantized(qc_mm *mm, float *w) {
    ggml_get_type_traits(mm->type)->to_float(mm->quantized, w, mm->k * mm->n);
    return 0;
}

size_t qc_mm_weight_bytes(qc_mm *mm) {
    return ggml_nbytes(mm->w);
}

const char *qc_mm_buffer_name(qc_mm *mm) {
    return mm->buffer_name;
}

void qc_mm_free(qc_mm *mm) {
    if (!mm) {
        return;
    }
    if (mm->buf_w) {
        ggml_backend_buffer_free(mm->buf_w);
    }
    if (mm->buf_xy) {
        ggml_backend_buffer_free(mm->buf_xy);
    }
    if (mm->ctx_graph) {
        ggml_free(mm->ctx_graph);
    }
    if (mm->ctx_xy) {
        ggml_free(mm->ctx_xy);
    }
    if (mm->ctx_w) {
        ggml_free(mm->ctx_w);
    }
    if (mm->backend) {
        ggml_backend_free(mm->backend);
    }
    free(mm->quantized);
    free(mm);
}
