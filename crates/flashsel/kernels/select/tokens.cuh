// Token output of a selection (the *_tok_* kernels): which columns each row
// selects from (a range, or QSA's visible blocks) and how its selection is
// written (each selected column as `ratio` token ids, the row's tail tokens,
// -1 padding, optionally mapped to KV-cache slots through a page table),
// written by the selection's own final write: no second pass.
//
// ROWS
//   QSA (positions != 0): row r is the query at t = positions[r]; it sees
//     V = (t + 1) / ratio blocks. V > k: select among columns [0, V), tail
//     tokens ratio * V ..= t. V <= k: select nothing (length 0, no score
//     read), tail 0 ..= t (the causal copy: blocks 0..V-1 and the tail).
//   Ranges (positions == 0): row r selects among [starts[r], lengths[r])
//     (starts: 0 when null; lengths, the range ends: cols when null); its
//     ids are absolute columns; no tail.
//   A row whose values are out of range (t < 0, V > cols, start < 0,
//   end < start, end > cols, a sequence outside the page table, a last token
//   past its sequence's pages) selects nothing and writes only -1, count 0:
//   the host checks what it can see; device-resident values are never
//   trusted to address memory.
// WRITE
//   Output row r holds `width` ids: the m = min(k, len) selected columns in
//   the selection's output order, column c as tokens start + c * ratio + i
//   (i < ratio), then the tail tokens, then -1; counts[r] = the valid ids.
//   With a page table a token tok of sequence s = seq_ids[r] is written as
//   page_table[s, tok / page_size] * page_size + tok % page_size (-1 where
//   the entry is negative or the slot does not fit an int).
// COST
//   A few loads per row for its extent (once for the stream, again at the
//   write), one page-table load per written id when mapped.
#ifndef FLASHSEL_SELECT_TOKENS_CUH
#define FLASHSEL_SELECT_TOKENS_CUH

#include "select/rows.cuh"

// The token description of a *_tok_* launch (a member of ScanParams and
// GridParams, mirrored by Tokens in src/ops/select/device.rs).
struct Tokens {
    const int* starts;      // ranges: per-row starts (nullable: 0)
    const int* positions;   // QSA: per-row absolute query positions (nullable: a range row)
    int* counts;            // nullable: valid ids per row
    const int* page_table;  // nullable: [batch, max_pages] pages; ids become slots
    const int* seq_ids;     // with page_table: the sequence of each row
    int ratio;              // tokens per selected column (QSA's ratio; 1 for ranges)
    int width;              // ids per output row
    int page_size;          // tokens per page
    int max_pages;          // page_table's row length
    int batch;              // page_table's rows
    int pad_;
};
static_assert(sizeof(Tokens) == 64, "Tokens layout changed: update src/ops/select/device.rs");

// A row's extent: select among [start, start + len) of the score row, then
// the tail tokens [tail_lo, tail_hi); seq: its page-table row.
struct TokRow {
    int start;
    int len;
    int tail_lo;
    int tail_hi;
    int seq;
};

// The CTA's current row extent, stashed in shared memory by thread 0 when
// the row starts (row_span) and read back by the write: no second look at
// the row's descriptors after the stream (a reload is a dependent global
// load on the write's critical path; values kept live across the stream
// cost the scan kernels registers they do not have).
__device__ __forceinline__ TokRow* tok_stash() {
    __shared__ TokRow stash;
    return &stash;
}

// Row `row`'s extent under P.tok (see ROWS above); all zero for a row whose
// values are out of range.
template <typename Params>
__device__ __forceinline__ TokRow tok_row(const Params& P, int row) {
    const Tokens& T = P.tok;
    TokRow r = {0, 0, 0, 0, 0};
    long long last;  // the row's last token, -1 for none
    if (T.positions) {
        const long long t = T.positions[row];
        const long long v = (t + 1) / T.ratio;
        if (t < 0 || v > P.cols) return r;
        r.len = v > P.k ? (int)v : 0;
        r.tail_lo = v > P.k ? (int)(v * T.ratio) : 0;
        r.tail_hi = (int)(t + 1);
        last = t;
    } else {
        const int s = T.starts ? T.starts[row] : 0;
        const int e = P.lengths ? P.lengths[row] : P.cols;
        if (s < 0 || e < s || e > P.cols) return r;
        r.start = s;
        r.len = e - s;
        last = (long long)e - 1;
    }
    if (T.page_table) {
        const int seq = T.seq_ids[row];
        if (seq < 0 || seq >= T.batch || (last >= 0 && last / T.page_size >= T.max_pages)) {
            r = TokRow{0, 0, 0, 0, 0};
            return r;
        }
        r.seq = seq;
    }
    return r;
}

// Where row `row` selects: [start, start + len) of its scores.
struct RowSpan {
    int start;
    int len;
};
// TOK: the extent of tok_row, stashed (tok_stash) for the row's write; the
// stash is read only after the CTA's next barrier.
template <bool TOK, typename Params>
__device__ __forceinline__ RowSpan row_span(const Params& P, int row) {
    if constexpr (TOK) {
        const TokRow r = tok_row(P, row);
        if (threadIdx.x == 0) *tok_stash() = r;
        return RowSpan{r.start, r.len};
    } else {
        return RowSpan{0, row_length(P.lengths, row, P.cols)};
    }
}

// Row `row`'s length after its stream (TOK: from the stash).
template <bool TOK, typename Params>
__device__ __forceinline__ int row_len_again(const Params& P, int row) {
    if constexpr (TOK) {
        return tok_stash()->len;
    } else {
        return row_length(P.lengths, row, P.cols);
    }
}

// The first score of row `row`'s span (TOK: the same loads as row_span's,
// issued right after them).
template <int TAG, bool TOK, typename Params>
__device__ __forceinline__ const void* span_scores(const Params& P, int row) {
    if constexpr (TOK) {
        const long long start = tok_row(P, row).start;
        return (const char*)row_start<TAG>(P, row) + start * (long long)sizeof(typename Elem<TAG>::raw);
    } else {
        return row_start<TAG>(P, row);
    }
}

// The id written for token `tok` of the row (a slot through the page table).
__device__ __forceinline__ int tok_id(const Tokens& T, const TokRow& r, int tok) {
    if (!T.page_table) return tok;
    const int page = T.page_table[(long long)r.seq * T.max_pages + tok / T.page_size];
    const long long slot = (long long)page * T.page_size + tok % T.page_size;
    return (page < 0 || slot > 0x7fffffffll) ? -1 : (int)slot;
}

// Output slot `slot` of the row's selection holds column `col`: its tokens.
__device__ __forceinline__ void tok_put(const Tokens& T, const TokRow& r, int* out_row, u32 slot, u32 col) {
    const int base = r.start + (int)col * T.ratio;
    for (int i = 0; i < T.ratio; ++i) out_row[slot * (u32)T.ratio + i] = tok_id(T, r, base + i);
}

// Entry u of what follows the row's m selected columns: a tail token, else -1.
__device__ __forceinline__ int tok_rest(const Tokens& T, const TokRow& r, u32 u) {
    return u < (u32)(r.tail_hi - r.tail_lo) ? tok_id(T, r, r.tail_lo + (int)u) : -1;
}

// The row's valid ids, given m selected columns.
__device__ __forceinline__ int tok_count(const Tokens& T, const TokRow& r, u32 m) {
    return (int)m * T.ratio + (r.tail_hi - r.tail_lo);
}

// The token write of a row without a page table or values (ids only), by a
// group of NT threads (t: this thread's rank in it): the m selected columns
// (col(s): column of output slot s) as ratio ids each, then the tail
// tokens, then -1, each entry j of out[0, width) written by thread j mod
// NT. The same ids as tok_put / tok_rest with no page table, with none of
// their per-entry tests (the first chunk's warp kernel spent ~45% of its
// instructions in the general form's write).
// Returns false, writing nothing, where the row has a page table or values
// (the general write runs); else also the row's count (thread 0).
template <int NT, typename Params, typename Col>
__device__ __forceinline__ bool tok_write_ids(const Params& P, int row, const TokRow& r, u32 m, u32 t, Col col) {
    const Tokens& T = P.tok;
    if (T.page_table || P.out_val) return false;
    int* out = P.out_idx + (long long)row * T.width;
    const u32 ratio = (u32)T.ratio, width = (u32)T.width;
    const u32 nsel = m * ratio;
    // j = s * ratio + i, kept incrementally (no divide per entry).
    u32 s = t / ratio, i = t - s * ratio;
    const u32 ds = (u32)NT / ratio, di = (u32)NT - ds * ratio;
    for (u32 j = t; j < nsel; j += NT) {
        out[j] = r.start + (int)(col(s) * ratio + i);
        s += ds;
        i += di;
        if (i >= ratio) {
            i -= ratio;
            ++s;
        }
    }
    const u32 tail = (u32)(r.tail_hi - r.tail_lo);
    for (u32 j = nsel + t; j < width; j += NT) {
        const u32 u = j - nsel;
        out[j] = u < tail ? r.tail_lo + (int)u : -1;
    }
    if (t == 0 && T.counts) T.counts[row] = tok_count(T, r, m);
    return true;
}

#endif  // FLASHSEL_SELECT_TOKENS_CUH
