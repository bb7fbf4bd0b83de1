/* Fused scaled-dot-product attention, float32, forward and backward (FlashAttention-style).
 *
 * Scores are computed a tile of queries by a tile of keys at a time with an online softmax, so the L x S score
 * matrix is never stored; the backward pass recomputes each tile's probabilities from q, k and the per-row
 * logsumexp the forward pass saved.
 *
 * Shapes: q (B, H, L, E), k (B, H, S, E), v (B, H, S, Ev); element (b, h, i, e) of an operand x lives at
 * x[b*x_bs + h*x_hs + i*x_rs + e] (unit column stride; a batch stride of 0 broadcasts). The mask, if any, is
 * read at mask[b*m_bs + h*m_hs + i*m_rs + j*m_cs] for query i and key j: TG_MASK_BOOL (uint8, nonzero =
 * attend) or TG_MASK_ADD (float, added to the scaled score). `causal` lets query i attend to keys j <= i.
 *
 * scores = scale * q k^T (+ mask); out = softmax(scores) v. A row whose scores are all -inf (fully masked)
 * gives zeros, with logsumexp -inf and zero gradients (torch's safe softmax).
 *
 * Outputs are contiguous: out (B, H, L, Ev), lse (B, H, L), dq (B, H, L, E), dk (B, H, S, E), dv (B, H, S, Ev).
 * out (forward), lse, dq, dk and dv may be NULL (not wanted). Every function returns 0, or TG_ATTENTION_NO_MEMORY. */
#ifndef TG_ATTENTION_H
#define TG_ATTENTION_H
#include <stdint.h>

enum tg_mask_kind { TG_MASK_NONE = 0, TG_MASK_BOOL = 1, TG_MASK_ADD = 2 };
enum tg_attention_status { TG_ATTENTION_OK = 0, TG_ATTENTION_NO_MEMORY = -3 };

typedef struct {
    const void *data;  /* uint8_t or float, see kind */
    int64_t bs, hs, rs, cs;
    int32_t kind;
} tg_attention_mask;

#define TG_ATTENTION_OPERANDS                                                                                  \
    int64_t batch, int64_t heads, int64_t l, int64_t s, int64_t e, int64_t ev, const float *q, int64_t q_bs,     \
        int64_t q_hs, int64_t q_rs, const float *k, int64_t k_bs, int64_t k_hs, int64_t k_rs, const float *v,    \
        int64_t v_bs, int64_t v_hs, int64_t v_rs, tg_attention_mask mask, int32_t causal, float scale
#define TG_ATTENTION_FORWARD_PARAMS TG_ATTENTION_OPERANDS, float *out, float *lse
/* out and lse are the forward pass's (contiguous); dout (B, H, L, Ev) is strided like q. */
#define TG_ATTENTION_BACKWARD_PARAMS                                                                           \
    TG_ATTENTION_OPERANDS, const float *out, const float *lse, const float *dout, int64_t do_bs, int64_t do_hs, \
        int64_t do_rs, float *dq, float *dk, float *dv

int tg_attention_forward_f32(TG_ATTENTION_FORWARD_PARAMS);
int tg_attention_backward_f32(TG_ATTENTION_BACKWARD_PARAMS);

/* The same, with every tile product on bfloat16 values summed in float32, as torch's flash attention on the cpu
 * computes bfloat16 inputs: q, k, v, dout, the weights P (for P V and dV = P^T dO) and the score gradients dS
 * (for dQ and dK) are rounded to bfloat16 before their products; the softmax, its sums, lse and the outputs stay
 * float32 (the weights' sums are taken before they are rounded). */
int tg_attention_forward_bf16(TG_ATTENTION_FORWARD_PARAMS);
int tg_attention_backward_bf16(TG_ATTENTION_BACKWARD_PARAMS);
#endif
