//! `qsa_attention`: QSA sparse attention, the consumer of the ids
//! [`qsa_select`](crate::ops::qsa) and [`qsa_indexer`](crate::ops::indexer)
//! write, with the semantics of the public QSA attention
//! (`flashinfer.qsa.qsa_indexed_forward` over cuDNN, which runs on SM100
//! only), and its exact float64 reference. `docs/semantics.md` ("QSA sparse
//! attention") states the same contract in prose.
//!
//! # Contract
//! Query row `t` has `h_q` heads `q[t, h, 0..d]` (`d` in {64, 128, 256};
//! `1 <= h_q <= 128`) and a list of `width >= 1` int32 entries: KV slots
//! (token ids of one sequence, or physical slots `page * page_size + offset`
//! as `qsa_select` writes them with a page table). The cache holds `h_kv`
//! key and value heads per slot (`h_q % h_kv == 0`); query head `h` reads
//! KV head `h / (h_q / h_kv)` (grouped-query attention: QSA's 24 / 2 heads,
//! or a tensor-parallel shard of 12 / 1).
//!
//! 1. **Valid entries.** Position `p` of row `t` is attended when `p < L_t`
//!    and its entry is a slot of the cache: `0 <= idx < num_pages *
//!    page_size`. Everything else (the -1 padding, out-of-range values)
//!    contributes nothing, and its K / V rows are never read (a NaN there
//!    never reaches an output).
//! 2. **`L_t`**: `lengths[t]` when given (each in `0..=width`; the `counts`
//!    of `qsa_select`), else derived: one past the last position holding a
//!    valid slot, `0` when there is none. Positions past it hold only
//!    invalid entries, so the derived length attends exactly the entries of
//!    rule 1 and the outputs are the same bits as passing it.
//! 3. **Duplicates**: every occurrence is attended (a softmax over the list
//!    of entries). `qsa_select`'s ids never repeat.
//! 4. With `l_j = scale * (q[t, h] . k_j)` over the attended entries `j` (in
//!    f64; `scale` the f32 the kernel gets, `1/sqrt(d)` rounded to f32 by
//!    default): `lse = ln(sum_j exp(l_j))` (natural log), `out = sum_j
//!    exp(l_j - lse) * v_j`. A NaN logit makes the head's `out` and `lse`
//!    NaN.
//! 5. **An empty row** (no attended entry): `out = 0`, `lse = -inf` (the
//!    log of an empty sum, as the public QSA attention returns it; FlashMLA's
//!    sparse MLA, [`crate::ops::mla`], returns `+inf` there instead).
//!
//! The order of the entries in a row does not change the result beyond
//! rounding (the public consumers treat a row as a set); the GPU kernel
//! walks them in list order, so its bytes are a function of the list.
//!
//! # Layout
//! `q [rows, h_q, d]` (f32 or bf16), `indices [rows, width]`, `lengths
//! [rows]`. `k` and `v` (f32 or bf16, one dtype for both) are paged caches
//! of the same geometry: slot `s` is token `s % page_size` of page `s /
//! page_size`, its KV head `g` the `d` values at element `(s / page_size) *
//! page_stride + (s % page_size) * token_stride + g * d`. One sequence of
//! `n` tokens `[n, h_kv, d]` is one page of `n` ([`QsaAttention::new`]).
//! Outputs: `out [rows, h_q, d]` (in q's dtype on the GPU), `lse [rows,
//! h_q]` f32.
//!
//! # The reference
//! [`reference_qsa_attention`] computes rule 4 in f64 from the decoded
//! inputs (bf16 and f32 decode exactly), entries in list order. GPU kernels
//! are tested against it with FlashMLA's published tolerances
//! ([`crate::ops::mla::OUT_TOLERANCE`], [`crate::ops::mla::LSE_TOLERANCE`],
//! [`crate::ops::mla::check_close`]). The CPU entry point
//! ([`qsa_attention`]) is the reference rounded to f32.

use rayon::prelude::*;

use crate::contract::{try_vec, DType, Error, Result};
pub use crate::ops::mla::MlaElem as AttnElem;
use crate::ops::mla::{bad, check_len, check_pages, max_nan, paged_len, product};

/// The head widths a request may have.
pub const DIMS: [usize; 3] = [64, 128, 256];
/// The most query heads a request may have.
pub const MAX_HEADS: usize = 128;

/// A QSA sparse attention request: everything but the data (module docs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QsaAttention {
    /// Query rows.
    pub rows: usize,
    pub h_q: usize,
    pub h_kv: usize,
    /// Head width of q, k and v.
    pub d: usize,
    /// Entries per index row.
    pub width: usize,
    pub num_pages: usize,
    pub page_size: usize,
    /// Cache elements between the starts of consecutive pages.
    pub page_stride: usize,
    /// Cache elements between the starts of consecutive tokens of a page
    /// (`>= h_kv * d`).
    pub token_stride: usize,
    /// The dtype of q (f32 or bf16); `out` has it on the GPU.
    pub q_dtype: DType,
    /// The dtype of k and v (f32 or bf16).
    pub kv_dtype: DType,
    pub scale: f32,
}

impl QsaAttention {
    /// A bf16 request over one sequence of `tokens` tokens (`k`, `v` `[tokens,
    /// h_kv, d]`, packed), `scale = 1/sqrt(d)`.
    pub fn new(rows: usize, tokens: usize, h_q: usize, h_kv: usize, d: usize, width: usize) -> Self {
        let w = h_kv * d;
        Self {
            rows,
            h_q,
            h_kv,
            d,
            width,
            num_pages: 1,
            page_size: tokens.max(1),
            page_stride: tokens.max(1) * w,
            token_stride: w,
            q_dtype: DType::BF16,
            kv_dtype: DType::BF16,
            scale: default_scale(d),
        }
    }
    /// The cache as `num_pages` packed pages of `page_size` tokens.
    pub fn with_pages(mut self, num_pages: usize, page_size: usize) -> Self {
        self.num_pages = num_pages;
        self.page_size = page_size;
        self.token_stride = self.h_kv * self.d;
        self.page_stride = page_size * self.token_stride;
        self
    }
    /// Strides of the cache, in elements.
    pub fn with_strides(mut self, page_stride: usize, token_stride: usize) -> Self {
        self.page_stride = page_stride;
        self.token_stride = token_stride;
        self
    }
    pub fn with_dtypes(mut self, q: DType, kv: DType) -> Self {
        self.q_dtype = q;
        self.kv_dtype = kv;
        self
    }
    pub fn with_scale(mut self, scale: f32) -> Self {
        self.scale = scale;
        self
    }

    /// Query heads per KV head.
    pub fn group(&self) -> usize {
        self.h_q / self.h_kv.max(1)
    }
    /// Slots of the cache (`num_pages * page_size`): the valid entries are
    /// `0..slots`.
    pub fn slots(&self) -> usize {
        self.num_pages.saturating_mul(self.page_size)
    }
    /// The cache element where KV head `g` of slot `slot` (`< slots()`)
    /// starts.
    pub fn head_at(&self, slot: usize, g: usize) -> usize {
        (slot / self.page_size) * self.page_stride + (slot % self.page_size) * self.token_stride + g * self.d
    }

    /// The shape rules: `1 <= h_q <= 128`, `h_kv >= 1` dividing `h_q`, `d` in
    /// {64, 128, 256}, `1 <= width <= i32::MAX`, a finite scale, f32 or bf16
    /// q and k / v, `page_size >= 1`, `token_stride >= h_kv * d`, a page's
    /// tokens before the next page, sizes that do not overflow.
    pub fn validate(&self) -> Result<()> {
        if self.h_q == 0 || self.h_q > MAX_HEADS {
            return Err(bad("h_q", self.h_q, "1..=128"));
        }
        if self.h_kv == 0 || !self.h_q.is_multiple_of(self.h_kv) {
            return Err(bad("h_kv", self.h_kv, "a divisor of h_q (grouped-query attention)"));
        }
        if !DIMS.contains(&self.d) {
            return Err(bad("d", self.d, "64, 128 or 256"));
        }
        if self.width == 0 {
            return Err(bad("width", 0, ">= 1 entries per index row"));
        }
        if self.width > i32::MAX as usize {
            return Err(Error::too_large("width", self.width as u128));
        }
        if !self.scale.is_finite() {
            return Err(bad("scale", self.scale, "a finite float"));
        }
        for (what, dt) in [("q", self.q_dtype), ("k / v", self.kv_dtype)] {
            if !matches!(dt, DType::F32 | DType::BF16) {
                return Err(Error::UnknownDType(format!("qsa_attention takes f32 or bf16 {what}, not {dt}")));
            }
        }
        let w = self.h_kv * self.d;
        check_pages(self.page_size, self.num_pages, self.page_stride, self.token_stride, w, || {
            format!("{} heads of {}", self.h_kv, self.d)
        })?;
        product("q", &[self.rows, self.h_q, self.d])?;
        product("indices", &[self.rows, self.width])?;
        self.cache_len()?;
        Ok(())
    }

    /// Elements each of `k` and `v` must hold: `(num_pages - 1) * page_stride
    /// + (page_size - 1) * token_stride + h_kv * d` (0 without pages).
    pub fn cache_len(&self) -> Result<usize> {
        paged_len(self.num_pages, self.page_size, self.page_stride, self.token_stride, self.h_kv * self.d)
    }
}

/// `1/sqrt(d)` rounded to f32 (exactly 0.125, 0.088388346, 0.0625 for d =
/// 64, 128, 256).
pub fn default_scale(d: usize) -> f32 {
    (1.0 / (d as f64).sqrt()) as f32
}

/// The derived lengths (rule 2) of the `indices.len() / width` rows: one
/// past the last position holding a slot in `0..slots`, 0 when none.
pub fn derive_lengths(indices: &[i32], width: usize, slots: usize) -> Vec<i32> {
    crate::ops::mla::derive_topk_length(indices, width, slots)
}

/// [`reference_qsa_attention`]'s result.
#[derive(Debug, Clone, PartialEq)]
pub struct QsaAttentionOutput<T> {
    /// `[rows, h_q, d]`.
    pub out: Vec<T>,
    /// `[rows, h_q]`: natural-log sum of exp of the scaled logits, `-inf`
    /// for an empty row.
    pub lse: Vec<T>,
}

impl QsaAttentionOutput<f64> {
    /// Every output rounded to f32 (round to nearest).
    pub fn to_f32(&self) -> QsaAttentionOutput<f32> {
        QsaAttentionOutput {
            out: self.out.iter().map(|&x| x as f32).collect(),
            lse: self.lse.iter().map(|&x| x as f32).collect(),
        }
    }
    /// `out` rounded to bf16 (straight from f64, round to nearest even).
    pub fn out_bf16(&self) -> Vec<half::bf16> {
        self.out.iter().map(|&x| half::bf16::from_f64(x)).collect()
    }
}

/// The checks of a request on host data (the reference's, and the CUDA
/// engine's host form's: the same errors): the spec, the dtypes, every
/// buffer's size, explicit lengths in `0..=width`.
pub(crate) fn check_request<Q: AttnElem, KV: AttnElem>(
    spec: &QsaAttention,
    q: &[Q],
    k: &[KV],
    v: &[KV],
    indices: &[i32],
    lengths: Option<&[i32]>,
) -> Result<()> {
    spec.validate()?;
    if Q::DTYPE != spec.q_dtype {
        return Err(Error::UnknownDType(format!("q is {} but the spec says {}", Q::DTYPE, spec.q_dtype)));
    }
    if KV::DTYPE != spec.kv_dtype {
        return Err(Error::UnknownDType(format!("k / v are {} but the spec says {}", KV::DTYPE, spec.kv_dtype)));
    }
    check_len("q", q.len(), spec.rows * spec.h_q * spec.d)?;
    let need = spec.cache_len()?;
    for (what, got) in [("k", k.len()), ("v", v.len())] {
        if got < need {
            return Err(Error::BufferSize { what, got, need });
        }
    }
    check_len("indices", indices.len(), spec.rows * spec.width)?;
    if let Some(l) = lengths {
        check_lengths(l, spec.rows, spec.width)?;
    }
    Ok(())
}

/// Explicit lengths: one per row, each in `0..=width`.
pub(crate) fn check_lengths(lengths: &[i32], rows: usize, width: usize) -> Result<()> {
    if lengths.len() != rows {
        return Err(Error::Shape(format!("lengths has {} entries but there are {rows} query rows", lengths.len())));
    }
    for (r, &l) in lengths.iter().enumerate() {
        if l < 0 || l as usize > width {
            return Err(bad("lengths", format!("{l} at row {r} (width = {width})"), "0..=width"));
        }
    }
    Ok(())
}

/// The exact QSA sparse attention (module docs, rules 1-5) in f64 over host
/// slices: `q [rows, h_q, d]`, the caches `k` and `v` (the spec's
/// geometry), `indices [rows, width]`, `lengths [rows]` (optional; derived
/// when absent). Only the K / V rows of attended entries are read. Rows run
/// in parallel; the result does not depend on the thread count.
pub fn reference_qsa_attention<Q: AttnElem, KV: AttnElem>(
    spec: &QsaAttention,
    q: &[Q],
    k: &[KV],
    v: &[KV],
    indices: &[i32],
    lengths: Option<&[i32]>,
) -> Result<QsaAttentionOutput<f64>> {
    check_request(spec, q, k, v, indices, lengths)?;
    let QsaAttention { rows, h_q, d, width, .. } = *spec;
    let group = spec.group();
    let slots = spec.slots();
    let scale = spec.scale as f64;
    let mut out = try_vec("out", rows * h_q * d, 0f64)?;
    let mut lse = try_vec("lse", rows * h_q, 0f64)?;
    out.par_chunks_mut(h_q * d).zip(lse.par_chunks_mut(h_q)).enumerate().for_each(|(t, (o, l))| {
        let row = &indices[t * width..(t + 1) * width];
        let len = lengths.map_or(width, |x| x[t] as usize);
        let att: Vec<usize> =
            row[..len].iter().filter(|&&i| i >= 0 && (i as usize) < slots).map(|&i| i as usize).collect();
        let mut logits = vec![0f64; att.len()];
        for h in 0..h_q {
            let g = h / group;
            let oh = &mut o[h * d..(h + 1) * d];
            oh.fill(0.0);
            if att.is_empty() {
                l[h] = f64::NEG_INFINITY;
                continue;
            }
            let qh: Vec<f64> = q[(t * h_q + h) * d..(t * h_q + h + 1) * d].iter().map(|x| x.to_f64()).collect();
            for (lj, &s) in logits.iter_mut().zip(&att) {
                let at = spec.head_at(s, g);
                *lj = scale * qh.iter().zip(&k[at..at + d]).map(|(a, b)| a * b.to_f64()).sum::<f64>();
            }
            let m = logits.iter().fold(f64::NEG_INFINITY, |a, &b| max_nan(a, b));
            let sum: f64 = logits.iter().map(|&x| (x - m).exp()).sum();
            for (&lj, &s) in logits.iter().zip(&att) {
                let w = (lj - m).exp() / sum;
                let at = spec.head_at(s, g);
                oh.iter_mut().zip(&v[at..at + d]).for_each(|(x, y)| *x += w * y.to_f64());
            }
            l[h] = m + sum.ln();
        }
    });
    Ok(QsaAttentionOutput { out, lse })
}

/// The CPU engine's QSA sparse attention: [`reference_qsa_attention`]
/// rounded to f32.
pub fn qsa_attention<Q: AttnElem, KV: AttnElem>(
    spec: &QsaAttention,
    q: &[Q],
    k: &[KV],
    v: &[KV],
    indices: &[i32],
    lengths: Option<&[i32]>,
) -> Result<QsaAttentionOutput<f32>> {
    Ok(reference_qsa_attention(spec, q, k, v, indices, lengths)?.to_f32())
}

#[cfg(test)]
mod tests;

pub mod check;
pub mod device;
