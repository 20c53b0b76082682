/* Decode attention with each prompt's KV kept once (flywheel.generation.prefix_attention).
 *
 * One query per row and head, q [B, Hq, D]. Row b attends to two spans:
 *   its prompt's keys and values, prompt_keys / prompt_values [U, Hkv, P, D], prompt u =
 *   row_prompt[b], the columns where prompt_mask[u, c] (row stride mask_stride);
 *   its own generated columns, row_keys / row_values [B, Hkv, T, D], columns 0 .. row_columns-1
 *   (every row has written the same number; T is the buffer's capacity).
 * out[b, h] = softmax(scale * q . k) v over both spans, with one running maximum (online
 * softmax), kv head h / (Hq / Hkv) (grouped-query attention). Masked columns are never read.
 * Rows [row_begin, row_end) only: callers split the batch across threads. All tensors are
 * contiguous float32 (the mask: bytes). */
#include <float.h>
#include <math.h>
#include <stdint.h>

static void span(const float *qi, const float *keys, const float *values, const uint8_t *mask, int64_t columns,
                 int64_t dim, float scale, float *top, float *total, float *acc) {
    for (int64_t c = 0; c < columns; ++c) {
        if (mask && !mask[c]) continue;
        const float *kc = keys + c * dim, *vc = values + c * dim;
        float s = 0.0f;
        for (int64_t d = 0; d < dim; ++d) s += qi[d] * kc[d];
        s *= scale;
        if (s > *top) {  /* a new maximum rescales what was summed so far */
            const float shrink = expf(*top - s);
            *total *= shrink;
            for (int64_t d = 0; d < dim; ++d) acc[d] *= shrink;
            *top = s;
        }
        const float p = expf(s - *top);
        *total += p;
        for (int64_t d = 0; d < dim; ++d) acc[d] += p * vc[d];
    }
}

int prefix_attention(const float *q, const float *prompt_keys, const float *prompt_values, const uint8_t *prompt_mask,
                     int64_t prompt_capacity, int64_t mask_stride, const int64_t *row_prompt, const float *row_keys,
                     const float *row_values, int64_t row_capacity, int64_t row_columns, float *out, int64_t q_heads,
                     int64_t kv_heads, int64_t dim, float scale, int64_t row_begin, int64_t row_end) {
    float acc[512];
    if (dim > 512 || kv_heads <= 0 || q_heads % kv_heads) return 1;
    const int64_t group = q_heads / kv_heads;
    for (int64_t b = row_begin; b < row_end; ++b) {
        const int64_t u = row_prompt[b];
        for (int64_t h = 0; h < q_heads; ++h) {
            const float *qi = q + (b * q_heads + h) * dim;
            const int64_t head = h / group;
            const int64_t prompt_at = (u * kv_heads + head) * prompt_capacity * dim;
            const int64_t row_at = (b * kv_heads + head) * row_capacity * dim;
            float top = -FLT_MAX, total = 0.0f;
            for (int64_t d = 0; d < dim; ++d) acc[d] = 0.0f;
            span(qi, prompt_keys + prompt_at, prompt_values + prompt_at, prompt_mask + u * mask_stride, prompt_capacity,
                 dim, scale, &top, &total, acc);
            span(qi, row_keys + row_at, row_values + row_at, 0, row_columns, dim, scale, &top, &total, acc);
            float *o = out + (b * q_heads + h) * dim;
            const float inv = total > 0.0f ? 1.0f / total : 0.0f;
            for (int64_t d = 0; d < dim; ++d) o[d] = acc[d] * inv;
        }
    }
    return 0;
}
